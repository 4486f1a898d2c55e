"""openai-agents: an agent with a function tool, over both the Responses and chat models."""
import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                    function_tool, set_tracing_disabled)

from .conftest import CHAT

set_tracing_disabled(True)     # the SDK would send traces to OpenAI's platform


@pytest.fixture(scope="module", params=["responses", "chat_completions"])
def model(request, async_openai_client):
    if request.param == "responses":
        return OpenAIResponsesModel(model=CHAT, openai_client=async_openai_client)
    return OpenAIChatCompletionsModel(model=CHAT, openai_client=async_openai_client)


def test_text_agent(model):
    agent = Agent(name="greeter", instructions="Answer in one sentence.", model=model,
                  model_settings=ModelSettings(max_tokens=128, temperature=0))
    result = Runner.run_sync(agent, "Say hello.")
    assert isinstance(result.final_output, str) and result.final_output


def test_agent_with_a_function_tool(model):
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"Sunny in {city}."

    agent = Agent(name="weather", instructions="Use the tool.", model=model, tools=[get_weather],
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                max_tokens=96,
                                                temperature=0))
    result = Runner.run_sync(agent, "What is the weather in Paris?")
    assert len(calls) == 1 and isinstance(calls[0], str)
    assert result.final_output == f"Sunny in {calls[0]}."
