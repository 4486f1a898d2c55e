"""langchain-ollama, unchanged, against the daemon's Ollama port: ChatOllama's invoke, stream,
bind_tools and with_structured_output, and OllamaEmbeddings."""
import pydantic
import pytest
from langchain_core.tools import tool
from langchain_ollama import ChatOllama, OllamaEmbeddings

from testing.daemon import Daemon

from .conftest import CHAT, CONFIG

pytestmark = pytest.mark.slow

EMBED = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("langchain-ollama") / "data"), CONFIG, models=True, ollama=True)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def connection(daemon):
    return {"base_url": f"http://127.0.0.1:{daemon.ollama_port}",
            "client_kwargs": {"headers": {"Authorization": f"Bearer {daemon.admin_key}"}, "timeout": 600}}


@pytest.fixture(scope="module")
def llm(connection):
    return ChatOllama(model=CHAT, temperature=0, num_predict=48, **connection)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_invoke_and_stream(llm):
    reply = llm.invoke("Say hello.")
    assert reply.content and reply.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream("Say hello."))
    assert "".join(c.content for c in chunks) == reply.content     # greedy: the same text


def test_bind_tools(llm):
    reply = llm.bind_tools([add]).invoke("What is two plus three? Use the add tool.")
    for call in reply.tool_calls:          # arguments as objects, read back as a dict
        assert call["name"] == "add" and set(call["args"]) <= {"a", "b"}
    assert reply.tool_calls or reply.content


class City(pydantic.BaseModel):
    name: str
    country: str


def test_with_structured_output(llm):
    city = llm.with_structured_output(City).invoke("Name a city in France.")
    assert isinstance(city, City) and city.name


def test_embeddings(connection):
    embeddings = OllamaEmbeddings(model=EMBED, **connection)
    [one, two] = embeddings.embed_documents(["hello world", "goodbye"])
    assert len(one) == len(two) == 384
    assert embeddings.embed_query("hello world") == pytest.approx(one, abs=1e-3)
