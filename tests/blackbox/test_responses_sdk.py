"""/v1/responses through the official openai SDK, against the real daemon and default model:
text, instructions, items with function calls and their outputs, tools, the typed events,
max_output_tokens (incomplete), json_schema output, and the 400s of stored state."""
import json

import openai
import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
CONFIG = "[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 1024\n"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("responses") / "data"), CONFIG, models=True)
    yield daemon.openai_client()
    daemon.stop()


def test_a_text_response(client):
    response = client.responses.create(model=CHAT, input="Say hello.", instructions="Be brief.",
                                       max_output_tokens=24, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == CHAT
    assert response.status in ("completed", "incomplete") and response.output_text
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_max_output_tokens_makes_it_incomplete(client):
    response = client.responses.create(model=CHAT, input="Write a long story about a dragon.",
                                       max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


def test_streamed_events(client):
    stream = client.responses.create(model=CHAT, input="Count to five.", max_output_tokens=12, stream=True)
    events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text


def test_the_stream_helper_gives_the_final_response(client):
    # (the SDK's helper wants response.completed: room enough for the model to finish)
    with client.responses.stream(model=CHAT, input="Say hi.", temperature=0, max_output_tokens=400) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text and final.usage.output_tokens > 0


def test_tools_and_a_function_call_round_trip(client):
    first = client.responses.create(model=CHAT, input="What is the weather in Paris?", tools=TOOLS,
                                    max_output_tokens=32)
    assert first.tools[0].name == "get_weather" and first.output
    response = client.responses.create(model=CHAT, tools=TOOLS, max_output_tokens=16, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24 C"}])
    assert response.output and response.status in ("completed", "incomplete")


def test_json_schema_output(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
              "required": ["name"], "additionalProperties": False}
    response = client.responses.create(model=CHAT, input="Name a fruit as JSON.", max_output_tokens=64,
                                       text={"format": {"type": "json_schema", "name": "fruit", "schema": schema}})
    assert response.status == "completed"
    assert set(json.loads(response.output_text)) == {"name"}


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"background": True}, "background"),
    ({"max_output_tokens": 0}, "max_output_tokens"), ({"tools": [{"type": "web_search"}]}, "tools[0].type")])
def test_bad_bodies_are_400s_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=CHAT, input="x", **extra)
    assert caught.value.body["param"] == param and caught.value.body["code"] == 400


def test_an_overlong_input_is_a_400_naming_input(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=CHAT, input="word " * 2000)
    assert caught.value.body["type"] == "context_length_exceeded" and caught.value.body["param"] == "input"
