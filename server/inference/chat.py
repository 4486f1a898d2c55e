"""POST /v1/chat/completions."""
from __future__ import annotations

import contextlib

from ..http import validate
from ..http.errors import ApiError, invalid
from ..http.response import Response, StreamingResponse, json_response
from ..observe.timings import timings
from . import generate, params, responses, templates

ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_MESSAGES = 4096


def _content(message: dict, where: str) -> str:
    content = message.get("content")
    if content is None:
        if message.get("role") == "assistant":
            return ""                     # an assistant turn that only called tools
        raise invalid(f"'{where}.content' is required", f"{where}.content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"'{where}.content' must be a string or an array of text parts",
                      f"{where}.content")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid(f"'{where}.content[{k}]' must be a text part "
                          "({\"type\": \"text\", \"text\": ...}); other part types are not supported",
                          f"{where}.content")
        texts.append(part["text"])
    return "".join(texts)


def messages_of(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty array of message objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"'messages' may hold at most {MAX_MESSAGES} messages", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{where}' must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"'{where}.role' must be one of {', '.join(ROLES)}", f"{where}.role")
        entry = {"role": "system" if role == "developer" else role,
                 "content": _content(message, where)}
        for optional in ("name", "tool_call_id"):
            if message.get(optional) is not None:
                entry[optional] = validate.string(message, optional, max_len=256)
        out.append(entry)
    return out


async def chat_completions(node, request) -> Response | StreamingResponse:
    body = request.json()
    model = await node.models.get(validate.string(body, "model", max_len=256), "chat")
    gen = params.parse(body, n_vocab=model.engine.n_vocab, chat=True)
    prompt = await templates.prompt_tokens(model, messages_of(body))
    generate.check_fits(len(prompt), model.context_length, "messages")
    stream = await model.runner.generate(generate.jobs_for([prompt], gen, model.context_length), gen.stop,
                                   generate.owner_of(request))
    head = responses.envelope("chat.completion", responses.new_id("chatcmpl"), model.id)
    if gen.stream:
        return StreamingResponse(_chunks(model.runner, stream, gen, head), b"text/event-stream")

    choices = await generate.collect(model.runner, stream, gen.n)
    head["choices"] = [{
        "index": i,
        "message": {"role": "assistant", "content": c.joined(), "refusal": None},
        "logprobs": responses.chat_logprobs(c.logprobs) if gen.logprobs else None,
        "finish_reason": c.finish_reason,
    } for i, c in enumerate(choices)]
    head["usage"] = responses.usage(choices, [0])
    head["timings"] = timings(choices, [0])
    return json_response(head)


async def _chunks(runner, stream, gen: params.Generation, head: dict):
    head = dict(head, object="chat.completion.chunk")
    usage_field = {"usage": None} if gen.include_usage else {}
    choices = [responses.Choice() for _ in range(gen.n)]

    def chunk(index: int, delta: dict, reason=None, logprobs=None, **extra) -> bytes:
        return responses.sse({**head, "choices": [{"index": index, "delta": delta,
                                                    "logprobs": logprobs, "finish_reason": reason}],
                              **usage_field, **extra})

    try:
        for i in range(gen.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        n_open = gen.n
        async with contextlib.aclosing(generate.follow(runner, stream, choices)) as events:
            async for index, choice, event in events:
                text = event.text
                entries = event.logprobs
                if text or entries:
                    logprobs = responses.chat_logprobs(entries) if gen.logprobs and entries else None
                    yield chunk(index, {"content": text.decode("utf-8", "replace")}, None, logprobs)
                if choice.finish_reason is not None:
                    n_open -= 1
                    last = n_open == 0 and not gen.include_usage   # the timings go in the last chunk
                    extra = {"timings": timings(choices, [0])} if last else {}
                    yield chunk(index, {}, choice.finish_reason, **extra)
        if gen.include_usage:
            yield responses.sse({**head, "choices": [], "usage": responses.usage(choices, [0]),
                                 "timings": timings(choices, [0])})
        yield responses.SSE_DONE
    except ApiError as exc:              # the head is sent: report in the stream, then end it
        yield responses.sse(exc.body())
