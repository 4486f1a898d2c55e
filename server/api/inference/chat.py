"""POST /v1/chat/completions."""
from __future__ import annotations

import contextlib

from ...http import validate
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...errors import DomainError
from ...observe.timings import timings
from ..errors import answer_of
from . import generate, params, responses
from . import tools as tools_params
from ...chat import templates
from ...chat import formats as chat_formats
from ...chat import limits as chat_limits
from ...chat import tools as chat_tools
from ...chat.grammar import check_grammar

ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_MESSAGES = 4096


TEXT_PART = validate.Object(
    "", validate.Const("type", "text", required=True),
    validate.String("text", required=True, max_len=None, allow_empty=True),
    message="'{field}' must be a text part ({{\"type\": \"text\", \"text\": ...}}); "
            "other part types are not supported")
TOOL_CALL = validate.Object(
    "", validate.String("id", max_len=256, allow_empty=True),
    validate.Const("type", "function"),
    validate.Object("function", validate.String("name", required=True, max_len=256),
                    validate.String("arguments", required=True, max_len=None, allow_empty=True),
                    required=True))
MESSAGE = validate.Object(
    "",
    validate.String("role", required=True, choices=ROLES),
    validate.OneOf("content", validate.String(max_len=None, allow_empty=True),
                   validate.Array(items=TEXT_PART),
                   doc="Required, except in an assistant turn that only called tools.",
                   message="'{field}' must be a string or an array of text parts"),
    validate.String("name", max_len=256),
    validate.String("tool_call_id", max_len=256),
    validate.Array("tool_calls", TOOL_CALL, max_items=tools_params.MAX_TOOLS,
                   doc="An assistant turn's calls (as answered in message.tool_calls)."),
    validate.String("reasoning_content", max_len=None, allow_empty=True,
                    doc="An assistant turn's thinking, for templates that show it."))
MESSAGES = validate.Array("messages", MESSAGE, required=True, min_items=1, max_items=MAX_MESSAGES,
                          doc="The conversation so far, oldest first.")


def messages_of(body: dict) -> list[dict]:
    """The conversation, checked against MESSAGES (in one pass), as the chat template takes it."""
    messages = body.get("messages")
    if messages is None:
        MESSAGES.absent("messages", "messages" in body)    # required: says so
    MESSAGES.check_size(messages, "messages")
    out = []
    for i, message in enumerate(messages):
        MESSAGE.check(message, ("messages", i))
        role = message["role"]
        content = message.get("content")
        if content is None:
            if role != "assistant":           # only an assistant turn may just call tools
                raise invalid(f"'messages[{i}].content' is required", f"messages[{i}].content")
            content = ""
        elif not isinstance(content, str):
            content = "".join(part["text"] for part in content)
        entry = {"role": "system" if role == "developer" else role, "content": content}
        for optional in ("name", "tool_call_id", "reasoning_content"):
            if message.get(optional) is not None:
                entry[optional] = message[optional]
        calls = message.get("tool_calls")
        if calls and role == "assistant":
            entry["tool_calls"] = [{"id": c.get("id") or "", "type": "function",
                                    "function": {"name": c["function"]["name"],
                                                 "arguments": c["function"]["arguments"]}}
                                   for c in calls]
        out.append(entry)
    return out


class ChatRun:
    """One chat request, validated and submitted: its answer as one object (`answer`) or as
    chunk objects (`chunks`), both in OpenAI's chat shapes. The other dialects (Responses,
    Anthropic messages) translate their bodies into a chat body, start a run, and translate
    these objects back: one path into the engine for every dialect."""

    __slots__ = ("model", "gen", "stream", "head", "parse")

    def __init__(self, model, gen: params.GenerationParams, stream, head: dict, parse=None):
        """`parse`: text -> (chat.tools.Message, complete), for answers that may hold tool calls
        or reasoning; None: the text is the content, as generated."""
        self.model, self.gen, self.stream, self.head, self.parse = model, gen, stream, head, parse

    async def answer(self) -> dict:
        """The chat.completion object."""
        gen = self.gen
        choices = await generate.collect(self.model.runner, self.stream, gen.n)
        return {**self.head, "choices": [{
            "index": i, **self._message(c),
            "logprobs": responses.chat_logprobs(c.logprobs) if gen.logprobs else None,
        } for i, c in enumerate(choices)], "usage": responses.usage(choices, [0]),
            "timings": timings(choices, [0])}

    def _message(self, choice: responses.Choice) -> dict:
        if self.parse is None:
            return {"message": {"role": "assistant", "content": choice.joined(), "refusal": None},
                    "finish_reason": choice.finish_reason, **responses.stop_field(choice, self.gen.stop)}
        fields, called = tools_params.Reader(self.parse).message(choice.joined())
        return {"message": {"role": "assistant", **fields, "refusal": None},
                "finish_reason": _finish(choice.finish_reason, called), **responses.stop_field(choice, self.gen.stop)}

    async def chunks(self):
        """The chat.completion.chunk objects, ending with the usage chunk when asked for. Raises
        ApiError or DomainError when the engine fails the request after the first chunk."""
        gen = self.gen
        head = dict(self.head, object="chat.completion.chunk")
        usage_field = {"usage": None} if gen.include_usage else {}
        choices = [responses.Choice() for _ in range(gen.n)]

        def chunk(index: int, delta: dict, reason=None, logprobs=None, finish_fields: dict | None = None,
                  **extra) -> dict:
            """`finish_fields`: the choice's fields beside its finish_reason (stop_reason)."""
            return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": reason, **(finish_fields or {})}], **usage_field, **extra}

        for i in range(gen.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        n_open = gen.n
        readers = [tools_params.Reader(self.parse) for _ in range(gen.n)] if self.parse else None
        async with contextlib.aclosing(generate.follow(self.model.runner, self.stream, choices)) as events:
            async for index, choice, event in events:
                text = event.text
                entries = event.logprobs
                if text or entries:
                    logprobs = responses.chat_logprobs(entries) if gen.logprobs and entries else None
                    if readers is None:
                        yield chunk(index, {"content": text.decode("utf-8", "replace")}, None, logprobs)
                    else:
                        deltas = readers[index].feed(text.decode("utf-8", "replace")) if text else []
                        for delta in deltas or ([{}] if logprobs else []):
                            yield chunk(index, delta, None, logprobs)
                            logprobs = None
                if choice.finish_reason is not None:
                    n_open -= 1
                    last = n_open == 0 and not gen.include_usage   # the timings go in the last chunk
                    extra = {"timings": timings(choices, [0])} if last else {}
                    reason = choice.finish_reason
                    if readers is not None:
                        reason = _finish(reason, bool(readers[index].seen.calls))
                    yield chunk(index, {}, reason, finish_fields=responses.stop_field(choice, gen.stop), **extra)
        if gen.include_usage:
            yield {**head, "choices": [], "usage": responses.usage(choices, [0]),
                   "timings": timings(choices, [0])}

    def cancel(self) -> None:
        """Free the request's slots (a no-op once every choice has finished)."""
        self.model.runner.cancel(self.stream)


def _finish(reason: str | None, called: bool) -> str | None:
    """An answer that ended by itself after calling tools finished for "tool_calls"."""
    return "tool_calls" if called and reason == "stop" else reason


def _has_tool_turns(messages: list[dict]) -> bool:
    return any(m["role"] == "tool" or "tool_calls" in m for m in messages)


class Prepared:
    """A chat body checked and its conversation rendered: what start() submits, and what a
    token count (Anthropic's count_tokens) measures."""

    __slots__ = ("model", "gen", "prompt", "parse")

    def __init__(self, model, gen: params.GenerationParams, prompt: list[int], parse):
        self.model, self.gen, self.prompt, self.parse = model, gen, prompt, parse


async def prepare(ctx, body: dict) -> Prepared:
    """Validate a chat body, and render and tokenize the conversation as the model sees it (with
    its tools and their grammar). Every 400 is raised here."""
    model = await ctx.models.get(params.MODEL.read(body), "chat")
    gen = params.parse(body, n_vocab=model.engine.n_vocab, chat=True)
    tool_request = tools_params.read(body)
    messages = messages_of(body)
    active = tool_request is not None and tool_request.active
    if active and gen.grammar:
        raise invalid("'response_format' cannot be combined with 'tools' (unless "
                      "'tool_choice' is 'none')", "response_format")
    template = model.template
    parse, extra = None, None
    if chat_formats.reads_tools(template) or chat_formats.thinks(template):
        if active or chat_formats.thinks(template) or _has_tool_turns(messages):
            messages, extra, parse = await _family_format(model, messages, tool_request, gen,
                                                          tools_params.REASONING_EFFORT.read(body))
    else:
        if tool_request is not None or _has_tool_turns(messages):
            messages = chat_tools.generic_messages(messages, tool_request)
        if active:
            gen.grammar = gen.sampling.grammar = chat_tools.generic_grammar(tool_request)
            parse = _generic_parse
    prompt = await templates.prompt_tokens(model, messages, extra)
    return Prepared(model, gen, prompt, parse)


async def start(ctx, request, body: dict) -> ChatRun:
    """Prepare a chat body and submit it. Every 400 is raised here, before anything is sent."""
    async def submit():
        p = await prepare(ctx, body)
        generate.check_fits(len(p.prompt), p.model.context_length, "messages")
        generate.check_share(ctx, p.model, p.gen.n)
        return p, await p.model.runner.generate(
            generate.jobs_for([p.prompt], p.gen, p.model.context_length), p.gen.engine_stops,
            generate.owner_of(request))

    p, stream = await generate.across_a_restart(ctx, params.MODEL.read(body), submit)
    head = responses.envelope("chat.completion", responses.new_id("chatcmpl"), p.model.id)
    return ChatRun(p.model, p.gen, stream, head, p.parse)


def _generic_parse(text: str, final: bool):
    return chat_tools.parse_generic(text)


async def _family_format(model, messages, tool_request, gen, effort):
    """A template that knows tools or thinks: llama.cpp's analysis of its format (formats.py)
    gives the grammar, its triggers and the parser; our sandbox renders the prompt."""
    active = tool_request is not None and tool_request.active
    thinking = effort != "none"
    analysis = await chat_formats.analyze(model.template, tool_request if active else None, thinking,
                                          "tools" if active else "messages")
    if analysis.supports_thinking and analysis.thinking_start and analysis.thinking_ends:
        await _thinking_budget(model, gen, analysis, effort)
    extra = {"enable_thinking": thinking}
    if active:
        extra["tools"] = [t.as_openai() for t in tool_request.offered()]
        if analysis.grammar:
            check_grammar(analysis.grammar, chat_limits.current, "tools")
            gen.grammar = gen.sampling.grammar = analysis.grammar
            gen.sampling.grammar_lazy = analysis.grammar_lazy
            gen.sampling.grammar_triggers = analysis.triggers
            if not analysis.grammar_lazy:       # it starts at the generation prompt, as in llama.cpp
                gen.sampling.grammar_prefill = (await model.runner.tokenize(
                    [analysis.generation_prompt.decode("utf-8", "replace")], False, True))[0]
        gen.format_stops = [s for s in analysis.stops if s not in gen.stop]
    reasoning = analysis.supports_thinking
    parse = analysis.parse_function(active, reasoning) if active or reasoning else None
    return chat_formats.render_messages(messages, analysis.caps), extra, parse


async def _thinking_budget(model, gen, analysis, effort) -> None:
    """The engine counts the thinking (between the template's tags) and, past the budget of the
    request's reasoning_effort (inference.reasoning_budget.*), forces the end tag; a lazy tool
    grammar sleeps through the thinking."""
    s = gen.sampling
    s.reasoning_budget = chat_limits.reasoning_budget.of(effort)
    s.reasoning_start = analysis.thinking_start
    s.reasoning_end = analysis.thinking_ends[0]
    s.reasoning_forced = (await model.runner.tokenize([analysis.thinking_ends[0]], False, True))[0]
    prompt_end = analysis.generation_prompt.decode("utf-8", "replace").rstrip()
    s.reasoning_open = prompt_end.endswith(analysis.thinking_start)


async def chat_completions(ctx, request) -> Response | StreamingResponse:
    run = await start(ctx, request, request.json())
    if run.gen.stream:
        return StreamingResponse(_sse(run), b"text/event-stream")
    return json_response(await run.answer())


async def _sse(run: ChatRun):
    try:
        async with contextlib.aclosing(run.chunks()) as chunks:
            async for chunk in chunks:
                yield responses.sse(chunk)
        yield responses.SSE_DONE
    except (ApiError, DomainError) as exc:   # the head is sent: report in the stream, then end it
        yield responses.sse(answer_of(exc).body())
