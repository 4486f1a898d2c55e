"""langchain-openai's ChatOpenAI: invoke, stream, batch, bound tools and structured output."""
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from .conftest import CHAT, CLIENT_TIMEOUT


class City(BaseModel):
    """A city and the country it is in."""
    name: str = Field(description="The city's name")
    country: str = Field(description="The country it is in")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module")
def llm(base_url, api_key):
    return ChatOpenAI(model=CHAT, base_url=base_url, api_key=api_key, max_retries=0,
                      timeout=CLIENT_TIMEOUT, max_tokens=64, temperature=0)


def test_invoke_stream_and_batch(llm):
    assert llm.invoke("Say hello.").content
    assert "".join(chunk.content for chunk in llm.stream("Say hello."))
    assert all(reply.content for reply in llm.batch(["Say hello.", "Name a colour."]))


def test_bind_tools_with_a_named_choice(llm):
    reply = llm.bind_tools([add], tool_choice="add").invoke("What is two plus three?")
    [call] = reply.tool_calls
    assert call["name"] == "add" and call["id"]
    assert isinstance(call["args"]["a"], int) and isinstance(call["args"]["b"], int)
    assert add.invoke(call["args"]) == call["args"]["a"] + call["args"]["b"]


def test_streamed_tool_call_chunks_add_up(llm):
    chunks = list(llm.bind_tools([add], tool_choice="required").stream("What is two plus three?"))
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    [call] = message.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_structured_output(llm, method):
    city = llm.with_structured_output(City, method=method).invoke(
        "Paris is the capital of France. Give the city and its country.")
    assert isinstance(city, City) and city.name and city.country
