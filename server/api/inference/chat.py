"""POST /v1/chat/completions."""
from __future__ import annotations

import contextlib
from dataclasses import replace

from ...http import validate
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...errors import DomainError
from ...observe.timings import timings
from ..errors import answer_of, api_error
from ...engine.errors import EngineError, ErrorCode
from ...engine.submission import TextJobs
from . import generate, params, responses
from . import tools as tools_params
from ...chat import templates
from ...chat import formats as chat_formats
from ...chat import limits as chat_limits
from ...chat import tools as chat_tools
from ...chat.grammar import check_grammar
from ...serving.output import ARGUMENTS, REASONING, TEXT, TOOL, Message, Piece, Step
from ...serving.reader import Reader, finished_for
from ...serving.request import ChatRequest, copy_sampling

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
    """One chat request, validated and submitted. Its output is typed (serving/output.py): a
    Step per engine event of a choice (`steps`), or one Message per choice once whole
    (`result`). Chat completions render them as OpenAI's chat objects (`answer`, `chunks`); the
    other dialects (Responses, Anthropic messages) render the same steps and messages as their
    content blocks: one path into the engine and one out of it for every dialect."""

    __slots__ = ("model", "gen", "stream", "head", "parse", "choices")

    def __init__(self, model, gen: params.GenerationParams, stream, head: dict, parse=None):
        """`parse`: text -> (chat.tools.Message, complete), for answers that may hold tool calls
        or reasoning; None: the text is the content, as generated."""
        self.model, self.gen, self.stream, self.head, self.parse = model, gen, stream, head, parse
        self.choices: list[responses.Choice] = []

    # ---- the typed output ------------------------------------------------------------------------

    async def result(self) -> list[Message]:
        """Every choice's whole answer."""
        self.choices = await generate.collect(self.model.runner, self.stream, self.gen.n)
        return [self._message(c) for c in self.choices]

    def _message(self, choice: responses.Choice) -> Message:
        stop = responses.stop_field(choice, self.gen.stop).get("stop_reason")
        if self.parse is None:
            return Message("", choice.joined(), [], choice.finish_reason, stop, choice)
        return Reader(self.parse).message(choice.joined(), choice.finish_reason, stop, choice)

    async def steps(self):
        """The answer as it grows: a Step per engine event. Raises ApiError or DomainError when
        the engine fails the request."""
        gen = self.gen
        self.choices = choices = [responses.Choice() for _ in range(gen.n)]
        readers = [Reader(self.parse) for _ in range(gen.n)] if self.parse else None
        async with contextlib.aclosing(generate.follow(self.model.runner, self.stream, choices)) as events:
            async for index, choice, event in events:
                text, entries = event.text, event.logprobs
                if readers is None:
                    pieces = [Piece(TEXT, text.decode("utf-8", "replace"))] if text or entries else []
                else:
                    pieces = readers[index].feed(text.decode("utf-8", "replace")) if text else []
                step = Step(index, choice, pieces, entries or None)
                if choice.finish_reason is not None:
                    step.finish = finished_for(choice.finish_reason, readers is not None and readers[index].called)
                    step.stop = responses.stop_field(choice, gen.stop).get("stop_reason")
                yield step

    def usage(self) -> dict:
        return responses.usage(self.choices, [0])

    def cancel(self) -> None:
        """Free the request's slots (a no-op once every choice has finished)."""
        self.model.runner.cancel(self.stream)

    # ---- as OpenAI's chat objects ----------------------------------------------------------------

    async def answer(self) -> dict:
        """The chat.completion object."""
        gen = self.gen
        messages = await self.result()
        return {**self.head, "choices": [{
            "index": i, "message": {"role": "assistant", **message_fields(m), "refusal": None},
            "finish_reason": m.finish, **_stop_reason(m.stop),
            "logprobs": responses.chat_logprobs(m.choice.logprobs) if gen.logprobs else None,
        } for i, m in enumerate(messages)], "usage": self.usage(), "timings": timings(self.choices, [0])}

    async def chunks(self):
        """The chat.completion.chunk objects, ending with the usage chunk when asked for. Raises
        ApiError or DomainError when the engine fails the request after the first chunk."""
        gen = self.gen
        head = dict(self.head, object="chat.completion.chunk")
        usage_field = {"usage": None} if gen.include_usage else {}

        def chunk(index: int, delta: dict, reason=None, logprobs=None, finish_fields: dict | None = None,
                  **extra) -> dict:
            """`finish_fields`: the choice's fields beside its finish_reason (stop_reason)."""
            return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": reason, **(finish_fields or {})}], **usage_field, **extra}

        for i in range(gen.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        n_open = gen.n
        async with contextlib.aclosing(self.steps()) as steps:
            async for step in steps:
                logprobs = responses.chat_logprobs(step.logprobs) if gen.logprobs and step.logprobs else None
                deltas = [DELTA_OF[p.kind](p) for p in step.pieces]
                if self.parse is not None and not deltas and logprobs:
                    deltas = [{}]                # the token's log-probabilities, nothing to show yet
                for delta in deltas:
                    yield chunk(step.index, delta, None, logprobs)
                    logprobs = None
                if step.finish is not None:
                    n_open -= 1
                    last = n_open == 0 and not gen.include_usage   # the timings go in the last chunk
                    extra = {"timings": timings(self.choices, [0])} if last else {}
                    yield chunk(step.index, {}, step.finish, finish_fields=_stop_reason(step.stop), **extra)
        if gen.include_usage:
            yield {**head, "choices": [], "usage": self.usage(), "timings": timings(self.choices, [0])}


def message_fields(m: Message) -> dict:
    """A whole answer as a chat message's fields."""
    fields: dict = {"content": m.content}
    if m.reasoning:
        fields["reasoning_content"] = fields["reasoning"] = m.reasoning
    if m.calls:
        fields["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                for c in m.calls]
    return fields


def _stop_reason(stop: str | None) -> dict:
    """vLLM's stop_reason: the client's stop string that ended the choice."""
    return {"stop_reason": stop} if stop is not None else {}


DELTA_OF = {
    REASONING: lambda p: {"reasoning_content": p.text, "reasoning": p.text},
    TEXT: lambda p: {"content": p.text},
    TOOL: lambda p: {"tool_calls": [{"index": p.call, "id": p.id, "type": "function",
                                     "function": {"name": p.name, "arguments": ""}}]},
    ARGUMENTS: lambda p: {"tool_calls": [{"index": p.call, "function": {"arguments": p.text}}]},
}


UNFIT = (ErrorCode.PROMPT_EMPTY, ErrorCode.CONTEXT_LENGTH)


def _has_tool_turns(messages: list[dict]) -> bool:
    return any(m["role"] == "tool" or "tool_calls" in m for m in messages)


class Prepared:
    """A chat body checked and its conversation rendered: what start() submits (the text, to
    be tokenized with the submit), and what a token count (Anthropic's count_tokens, /tokenize)
    measures. `reasoning_forced` and `grammar_prefill`: texts whose tokens the choices'
    sampling takes (the thinking budget's end tag; a grammar's start), tokenized beside it."""

    __slots__ = ("model", "gen", "text", "parse", "what", "reasoning_forced", "grammar_prefill")

    def __init__(self, model, gen: params.GenerationParams, text: str, parse, what: str = "messages",
                 reasoning_forced: str | None = None, grammar_prefill: str | None = None):
        """`what`: the body's field the conversation came from, named by a fit's 400."""
        self.model, self.gen, self.text, self.parse, self.what = model, gen, text, parse, what
        self.reasoning_forced, self.grammar_prefill = reasoning_forced, grammar_prefill

    async def prompt_tokens(self) -> list[int]:
        return (await self.model.runner.tokenize([self.text], False, True))[0]

    def jobs(self) -> TextJobs:
        """One job per choice, its prompt as text (tokenized where the vocabulary is)."""
        gen = self.gen
        return TextJobs(self.text, [gen.sampling_for_choice(j) for j in range(gen.candidates)],
                        gen.max_tokens, self.model.context_length, self.what,
                        reasoning_forced=self.reasoning_forced, grammar_prefill=self.grammar_prefill)


def parse(body: dict) -> ChatRequest:
    """A chat completions body as the typed request, each field read once (every 400 of the
    body's own fields is raised here, before any model is looked up)."""
    model = params.MODEL.read(body)
    gen = params.read(body, chat=True)
    tools = tools_params.read(body)
    return ChatRequest(model, messages_of(body), gen, tools, tools_params.REASONING_EFFORT.read(body))


async def prepare(ctx, chat: ChatRequest) -> Prepared:
    """The conversation rendered as the model sees it (with its tools and their grammar), and
    the texts whose tokens its sampling needs. The request itself is left as it was (a request
    the restart of its worker caught is prepared again)."""
    model = await ctx.models.get(chat.model, "chat")
    gen = replace(chat.gen, sampling=copy_sampling(chat.gen.sampling), format_stops=[])
    params.check_vocabulary(gen, model.engine.n_vocab, chat.name_of("top_k"))
    tool_request, messages = chat.tools, chat.messages
    active = tool_request is not None and tool_request.active
    if active and gen.grammar:
        fmt = chat.name_of("response_format")
        raise invalid(f"'{fmt}' cannot be combined with 'tools' (unless "
                      f"'{chat.name_of('tool_choice')}' is 'none')", fmt)
    template = model.template
    parse, extra, token_texts = None, None, {}
    if chat_formats.reads_tools(template) or chat_formats.thinks(template):
        if active or chat_formats.thinks(template) or _has_tool_turns(messages):
            messages, extra, parse, token_texts = await _family_format(
                model, messages, tool_request, gen, chat.reasoning_effort, chat.name_of("tools"))
    else:
        if tool_request is not None or _has_tool_turns(messages):
            messages = chat_tools.generic_messages(messages, tool_request)
        if active:
            gen.grammar = gen.sampling.grammar = chat_tools.generic_grammar(tool_request)
            parse = _generic_parse
    text = await templates.render(model, messages, extra)
    return Prepared(model, gen, text, parse, chat.name_of("messages"), **token_texts)


async def start(ctx, request, chat: ChatRequest) -> ChatRun:
    """Prepare a chat request and submit it: one exchange with the model's worker, which
    tokenizes the prompt, checks its fit and takes every choice or none. Every 400 is raised
    here, before anything is sent to the client."""
    async def submit():
        p = await prepare(ctx, chat)
        generate.check_share(ctx, p.model, p.gen.n)
        try:
            return p, await p.model.runner.generate(p.jobs(), p.gen.engine_stops, generate.owner_of(request))
        except EngineError as exc:
            if exc.code in UNFIT:                # the request's own 400, in its field's words
                raise api_error(exc) from None
            raise

    p, stream = await ctx.models.hold.across(chat.model, submit)
    head = responses.envelope("chat.completion", responses.new_id("chatcmpl"), p.model.id)
    return ChatRun(p.model, p.gen, stream, head, p.parse)


def _generic_parse(text: str, final: bool):
    return chat_tools.parse_generic(text)


async def _family_format(model, messages, tool_request, gen, effort, tools_field: str):
    """A template that knows tools or thinks: llama.cpp's analysis of its format (formats.py)
    gives the grammar, its triggers and the parser; our sandbox renders the prompt. Also the
    texts whose tokens the sampling needs (Prepared's reasoning_forced, grammar_prefill)."""
    active = tool_request is not None and tool_request.active
    thinking = effort != "none"
    analysis = await chat_formats.analyze(model.template, tool_request if active else None, thinking,
                                          "tools" if active else "messages")
    token_texts = {}
    if analysis.supports_thinking and analysis.thinking_start and analysis.thinking_ends:
        token_texts["reasoning_forced"] = _thinking_budget(gen, analysis, effort)
    extra = {"enable_thinking": thinking}
    if active:
        extra["tools"] = [t.as_openai() for t in tool_request.offered()]
        if analysis.grammar:
            check_grammar(analysis.grammar, chat_limits.current, tools_field)
            gen.grammar = gen.sampling.grammar = analysis.grammar
            gen.sampling.grammar_lazy = analysis.grammar_lazy
            gen.sampling.grammar_triggers = analysis.triggers
            if not analysis.grammar_lazy:       # it starts at the generation prompt, as in llama.cpp
                token_texts["grammar_prefill"] = analysis.generation_prompt.decode("utf-8", "replace")
        gen.format_stops = [s for s in analysis.stops if s not in gen.stop]
    reasoning = analysis.supports_thinking
    parse = analysis.parse_function(active, reasoning) if active or reasoning else None
    return chat_formats.render_messages(messages, analysis.caps), extra, parse, token_texts


def _thinking_budget(gen, analysis, effort) -> str:
    """The engine counts the thinking (between the template's tags) and, past the budget of the
    request's reasoning_effort (inference.reasoning_budget.*), forces the end tag (whose text
    this returns: its tokens go with the submit); a lazy tool grammar sleeps through the
    thinking."""
    s = gen.sampling
    s.reasoning_budget = chat_limits.reasoning_budget.of(effort)
    s.reasoning_start = analysis.thinking_start
    s.reasoning_end = analysis.thinking_ends[0]
    prompt_end = analysis.generation_prompt.decode("utf-8", "replace").rstrip()
    s.reasoning_open = prompt_end.endswith(analysis.thinking_start)
    return analysis.thinking_ends[0]


async def chat_completions(ctx, request) -> Response | StreamingResponse:
    run = await start(ctx, request, parse(request.json()))
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
