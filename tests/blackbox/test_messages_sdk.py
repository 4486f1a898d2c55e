"""/v1/messages through the official anthropic SDK, against the real daemon and default model:
the key as x-api-key and as a bearer token, streamed and not, count_tokens, errors in
Anthropic's shape, and the same permissions and rate limits as the OpenAI routes."""
import time

import anthropic
import pytest

from testing.daemon import Daemon, create_key

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
CONFIG = "[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 1024\n"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("messages") / "data"), CONFIG, models=True)
    yield daemon
    daemon.stop()


def client_of(daemon, **auth) -> anthropic.Anthropic:
    auth = auth or {"api_key": daemon.admin_key}
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{daemon.inference_port}", max_retries=0,
                               timeout=600, **auth)


@pytest.fixture(scope="module")
def client(daemon):
    return client_of(daemon)


def test_a_message_with_x_api_key(client):
    message = client.messages.create(model=CHAT, max_tokens=24, system="Be brief.", messages=HELLO,
                                     extra_body={"temperature": 0})   # (this SDK's create has no temperature)
    assert message.type == "message" and message.role == "assistant" and message.model == CHAT
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 24


def test_models_are_listed_with_x_api_key_too(client):
    """Anthropic's SDK lists models with its x-api-key header."""
    listed = client.models.list()
    assert CHAT in [model.id for model in listed.data]
    assert client.models.retrieve(CHAT).id == CHAT


def test_a_bearer_key_works_too(daemon):
    message = client_of(daemon, auth_token=daemon.admin_key).messages.create(
        model=CHAT, max_tokens=4, messages=HELLO)
    assert message.content[0].text


def test_max_tokens_stops_with_max_tokens(client):
    message = client.messages.create(model=CHAT, max_tokens=3, messages=[
        {"role": "user", "content": "Write a long story about a dragon."}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_streamed_events_build_the_same_kind_of_message(client):
    with client.messages.stream(model=CHAT, max_tokens=12, messages=HELLO) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].type == "text" and final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


# Letters some English answer has: the earliest in the text ends it.
STOPS = ["e", "a", "o"]
STORY = [{"role": "user", "content": "Tell me about the sea."}]


def test_a_stop_sequence_ends_the_message_and_is_named(client):
    message = client.messages.create(model=CHAT, max_tokens=48, messages=STORY, stop_sequences=STOPS,
                                     extra_body={"temperature": 0})
    assert message.stop_reason == "stop_sequence" and message.stop_sequence in STOPS
    text = "".join(block.text for block in message.content)
    assert not any(stop in text for stop in STOPS)       # the text before it, without it


def test_a_streamed_stop_sequence_is_named_in_the_message_delta(client):
    with client.messages.stream(model=CHAT, max_tokens=48, messages=STORY, stop_sequences=STOPS) as stream:
        deltas = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    assert deltas[-1].delta.stop_reason == "stop_sequence" and deltas[-1].delta.stop_sequence in STOPS
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == deltas[-1].delta.stop_sequence


def test_without_stop_sequences_none_is_named(client):
    message = client.messages.create(model=CHAT, max_tokens=4, messages=STORY)
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None


def test_a_conversation_with_tool_use_and_tool_result(client):
    tools = [{"name": "get_weather", "description": "Weather of a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    message = client.messages.create(model=CHAT, max_tokens=16, tools=tools, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    assert message.content and message.stop_reason in ("end_turn", "max_tokens", "tool_use")


WEATHER = [{"name": "get_weather", "description": "Weather of a city.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ASK_WEATHER = [{"role": "user", "content": "weather in Paris?"}]
CUT = 22                       # tokens: the call has begun, its arguments are not whole


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_cut_off_by_max_tokens_stops_with_max_tokens(client, stream):
    """A call whose arguments max_tokens cut is no call to run: Anthropic says max_tokens."""
    ask = dict(model=CHAT, max_tokens=CUT, tools=WEATHER, tool_choice={"type": "any"},
               messages=ASK_WEATHER, extra_body={"temperature": 0})
    if stream:
        with client.messages.stream(**ask) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**ask)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == CUT


def test_a_whole_tool_call_stops_with_tool_use(client):
    message = client.messages.create(model=CHAT, max_tokens=200, tools=WEATHER, tool_choice={"type": "any"},
                                     messages=ASK_WEATHER, extra_body={"temperature": 0})
    call = next(block for block in message.content if block.type == "tool_use")
    assert message.stop_reason == "tool_use" and call.name == "get_weather" and "city" in call.input


def test_count_tokens_is_what_the_message_reads(client):
    longer = [{"role": "user", "content": "Say hello to everyone in the room, please."}]
    short = client.messages.count_tokens(model=CHAT, messages=HELLO).input_tokens
    assert 0 < short < client.messages.count_tokens(model=CHAT, messages=longer).input_tokens
    usage = client.messages.create(model=CHAT, max_tokens=1, messages=HELLO).usage
    assert usage.input_tokens + usage.cache_read_input_tokens == short


def test_a_bad_body_is_a_400_in_anthropic_s_shape(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=CHAT, max_tokens=0, messages=HELLO)
    assert caught.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "code": 400, "param": "max_tokens",
        "message": "'max_tokens' must be between 1 and 1048576, got 0"}}


def test_an_unknown_model_is_a_404_in_anthropic_s_shape(client):
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-sonnet-4", max_tokens=4, messages=HELLO)
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "not_found_error"


def test_a_wrong_or_missing_key_is_a_401(daemon):
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client_of(daemon, api_key="sk-wrong").messages.create(model=CHAT, max_tokens=4, messages=HELLO)
    assert caught.value.body["error"] == {"type": "authentication_error", "message": "invalid API key",
                                          "code": 401}
    status, _, body = daemon.request("POST", "/v1/messages", port="inference",
                                     body={"model": CHAT, "max_tokens": 4, "messages": HELLO})
    assert status == 401 and "x-api-key" in body["error"]["message"]


def test_a_key_without_inference_is_a_403(daemon):
    key = create_key(daemon.data_dir, "reader", "cluster:read")
    client = client_of(daemon, api_key=key)
    deadline = time.monotonic() + 60          # the daemon picks new keys up on its sweep
    while time.monotonic() < deadline:
        try:
            client.messages.count_tokens(model=CHAT, messages=HELLO)
        except anthropic.AuthenticationError:
            time.sleep(0.2)
            continue
        except anthropic.PermissionDeniedError as exc:
            assert exc.body["error"]["type"] == "permission_error" and exc.body["error"]["code"] == 403
            return
    pytest.fail("the new key was never picked up")


def test_the_inference_rate_limit_counts_x_api_key_requests(start_daemon_limited):
    daemon = start_daemon_limited
    client = client_of(daemon)
    statuses = []
    for _ in range(3):
        try:
            client.messages.count_tokens(model=CHAT, messages=HELLO)
            statuses.append(200)
        except anthropic.RateLimitError as exc:
            statuses.append(429)
            assert exc.body["error"]["type"] == "rate_limit_error" and exc.response.headers["retry-after"]
    assert statuses == [200, 200, 429]


@pytest.fixture
def start_daemon_limited(tmp_path):
    daemon = Daemon(str(tmp_path / "data"), "[rate_limits]\ninference = 2\n[engine]\ncontext_length = 512\n",
                    models=True)
    yield daemon
    daemon.stop()
