"""pydantic-ai agents on the daemon through its OpenAI chat model: text, a tool, typed output."""
import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from .conftest import CHAT


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def model(async_openai_client):
    return OpenAIChatModel(CHAT, provider=OpenAIProvider(openai_client=async_openai_client))


def test_text_agent(model):
    result = Agent(model, instructions="Answer in one sentence.").run_sync(
        "Say hello.", model_settings={"max_tokens": 32})
    assert isinstance(result.output, str) and result.output


def test_structured_output_agent(model):
    """pydantic-ai's default structured output is a tool the model must call."""
    result = Agent(model, output_type=City).run_sync(
        "Paris is the capital of France. Give the city and its country.",
        model_settings={"max_tokens": 96, "temperature": 0})
    assert isinstance(result.output, City) and result.output.name


def test_agent_calls_a_tool(model):
    calls = []
    agent = Agent(model, output_type=City, retries=3)   # a 135M model may need a second try

    async def once(ctx, tool):
        """Offered until called: then only the output tool is left, which the model must call."""
        return None if calls else tool

    @agent.tool_plain(prepare=once)
    def country_of(city: str) -> str:
        """The country a city is in."""
        calls.append(city)
        return "France"

    result = agent.run_sync("Which country is Paris in? Look it up, then give the city and its country.",
                            model_settings={"max_tokens": 96, "temperature": 0})
    assert isinstance(result.output, City)
    names = [part.tool_name for message in result.all_messages()
             for part in getattr(message, "parts", []) if part.part_kind == "tool-call"]
    assert names and names[-1] == "final_result", "a typed output ends with pydantic-ai's output tool"
    assert all(name in ("country_of", "final_result") for name in names)
    assert all(isinstance(city, str) for city in calls)
