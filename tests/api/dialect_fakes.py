"""A fake chat.ChatRun for the dialect tests: the layer under test is the translation, so the
run answers what a test gives it, in chat's shapes (tool calls as the chat helper sends them)."""
import orjson

from stackd.http.errors import ApiError, ErrorKind

HEAD = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "system_fingerprint": "x"}
USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
         "prompt_tokens_details": {"cached_tokens": 2}}


def answer(content="", reasoning=None, calls=(), finish="stop") -> dict:
    message = {"role": "assistant", "content": content, "refusal": None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": id_, "type": "function", "function": {"name": name, "arguments": args}}
                                 for id_, name, args in calls]
    return {**HEAD, "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": finish}], "usage": USAGE}


def deltas(reasoning=(), text=(), calls=(), finish="stop") -> list[dict]:
    """Chunk deltas: reasoning pieces, text pieces, then each call (id, name, argument pieces)."""
    out = [{"role": "assistant", "content": ""}]
    out += [{"reasoning_content": piece} for piece in reasoning]
    out += [{"content": piece} for piece in text]
    for index, (id_, name, pieces) in enumerate(calls):
        out.append({"tool_calls": [{"index": index, "id": id_, "type": "function",
                                    "function": {"name": name, "arguments": ""}}]})
        out += [{"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in pieces]
    return out + [finish]


class FakeRun:
    def __init__(self, answer=None, deltas=(), fail_after=None):
        self._answer, self._deltas, self.fail_after = answer, list(deltas), fail_after
        self.closed = False
        self.finish_choice = None     # a last choice's fields to send after the deltas

    async def answer(self):
        return self._answer

    async def chunks(self):
        head = {**HEAD, "object": "chat.completion.chunk"}
        try:
            for i, delta in enumerate(self._deltas):
                if i == self.fail_after:
                    raise ApiError(ErrorKind.UNAVAILABLE, "the model's worker was lost")
                if isinstance(delta, str):        # the finish reason
                    yield {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                "finish_reason": delta}], "usage": None}
                else:
                    yield {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                "finish_reason": None}], "usage": None}
            if self.finish_choice is not None:
                yield {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, **self.finish_choice}],
                       "usage": None}
            yield {**head, "choices": [], "usage": USAGE}
        finally:
            self.closed = True

    def cancel(self):
        pass


async def gather(stream) -> list[tuple[str, dict]]:
    """A named-event stream's (event, data) pairs."""
    out = []
    async for raw in stream:
        head, data = raw.decode().strip().split("\n")
        assert head.startswith("event: ") and data.startswith("data: ")
        out.append((head[7:], orjson.loads(data[6:])))
    return out
