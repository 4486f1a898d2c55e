"""The Anthropic messages API through the official anthropic SDK, unchanged."""
import anthropic
import pytest

from .conftest import CHAT, CLIENT_TIMEOUT
from .tools import WEATHER, arguments_of

TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# The calls below are greedy: how long a forced call runs is the model's choice, and at the SDK's
# default temperature (1.0) one CI run drew a call still open at 128 tokens (3,000 local draws
# of the same requests ended within 71). What these tests show is the SDK's side, not sampling.
# (anthropic 2.13 takes no temperature argument: it goes in the body, as any client can put it.)
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module", params=["x-api-key", "bearer"])
def client(request, daemon, api_key):
    base = f"http://127.0.0.1:{daemon.inference_port}"
    if request.param == "x-api-key":
        return anthropic.Anthropic(base_url=base, api_key=api_key, max_retries=0,
                                   timeout=CLIENT_TIMEOUT)
    return anthropic.Anthropic(base_url=base, auth_token=api_key, api_key=None, max_retries=0,
                               timeout=CLIENT_TIMEOUT)


def test_text_message(client):
    message = client.messages.create(model=CHAT, max_tokens=24, messages=ASK,
                                     system="Answer in one sentence.")
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_streamed_text(client):
    with client.messages.stream(model=CHAT, max_tokens=16, messages=ASK) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.content[0].text


def test_forced_tool_use(client):
    message = client.messages.create(model=CHAT, max_tokens=128, messages=ASK, tools=[TOOL],
                                     tool_choice={"type": "any"}, extra_body=GREEDY)
    assert message.stop_reason == "tool_use", message.content
    [use] = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    arguments_of("get_weather", use.input)


def test_streamed_tool_use(client):
    with client.messages.stream(model=CHAT, max_tokens=128, messages=ASK, tools=[TOOL],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use", final.content
    [use] = [block for block in final.content if block.type == "tool_use"]
    assert arguments_of("get_weather", use.input)["city"]


def test_tool_result_turn(client):
    messages = ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "Sunny, 24 degrees celsius."}]},
    ]
    message = client.messages.create(model=CHAT, max_tokens=32, messages=messages, tools=[TOOL])
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens(client):
    counted = client.messages.count_tokens(model=CHAT, messages=ASK, tools=[TOOL])
    plain = client.messages.count_tokens(model=CHAT, messages=ASK)
    assert counted.input_tokens > plain.input_tokens > 0


def test_errors_reach_the_sdk_as_its_own_exceptions(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=CHAT, max_tokens=8, messages=[])


def test_a_wrong_key_is_refused(daemon):
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{daemon.inference_port}",
                                 api_key="sk-wrong", max_retries=0, timeout=CLIENT_TIMEOUT)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model=CHAT, max_tokens=8, messages=ASK)
