"""Model-family chat formats (tool calls, reasoning) from llama.cpp's common/chat library.

A template that reads `tools` (Hermes/Qwen `<tool_call>`, Llama 3.x JSON, Mistral
`[TOOL_CALLS]`, ...) or that thinks (`<think>`) is analysed by llama.cpp itself: its
capabilities, the format of its answers, the grammar of a call with the family's trigger
words, and a PEG parser that reads the answer back. How the template stays bounded (the house
rule: templates render only in a sandbox):

* the prompt is rendered by our sandbox (sandbox.py), as every prompt is, with `tools` and
  `enable_thinking` passed in and llama.cpp's message workarounds applied here;
* the analysis runs llama.cpp's C++ jinja runtime, which has no bound of its own, so it runs
  only in a child process (format_worker.py) with its address space capped (ANALYSIS_MEMORY)
  and killed after ANALYSIS_TIMEOUT_FACTOR x inference.limits.template_timeout; a template or a
  tool schema that crashes it, hangs it or exhausts it is a 400;
* an analysis depends only on the template, the tools, the choice and the thinking switch, never
  on the conversation (it is given one fixed user turn), so it is cached per model and tool set;
* the parser it returns only reads generated text (bounded by the request's tokens) in the daemon.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import json
import os
import re
import sys

from ..errors import invalid
from . import limits as _limits
from .tools import Call, Message, ToolRequest

ANALYSIS_MEMORY = 1 << 30          # bytes of address space the analysing process may map
ANALYSIS_TIMEOUT_FACTOR = 10       # an analysis renders the template a dozen times
CACHE_SIZE = 256
PROBE = [{"role": "user", "content": "Hello"}]
THINKING_MARKS = ("<think>", "enable_thinking", "reasoning_content", "<|channel|>")


def reads_tools(template) -> bool:
    return "tools" in template.variables


def thinks(template) -> bool:
    """Whether a template may think: only then is a request without tools analysed."""
    return any(mark in template.source for mark in THINKING_MARKS)


class Analysis:
    """What llama.cpp made of a template for one tool set (see the module's docstring)."""

    __slots__ = ("caps", "format", "format_name", "grammar", "grammar_lazy", "triggers", "stops",
                 "parser", "generation_prompt", "supports_thinking", "thinking_start",
                 "thinking_ends", "supports_enable_thinking", "_parser")

    def __init__(self, raw: dict):
        self.caps = raw["caps"]
        self.format = raw["format"]
        self.format_name = raw["format_name"]
        self.grammar = raw["grammar"]
        self.grammar_lazy = raw["grammar_lazy"]
        self.triggers = list(raw["trigger_patterns"])
        self.stops = list(raw["additional_stops"])
        self.parser = base64.b64decode(raw["parser"])
        self.generation_prompt = base64.b64decode(raw["generation_prompt"])
        self.supports_thinking = raw["supports_thinking"]
        self.thinking_start = raw["thinking_start_tag"]
        self.thinking_ends = list(raw["thinking_end_tags"])
        self.supports_enable_thinking = raw["supports_enable_thinking"]
        self._parser = None

    def parse_function(self, tools: bool, reasoning: bool):
        """(text, final) -> (Message, complete), with llama.cpp's parser for this format: a
        partial read while the answer grows, a whole one at its end (falling back to the
        partial read when the answer was cut short or left the format)."""
        from .. import _chat
        parser = _chat.Parser(self.format, self.parser, self.generation_prompt, reasoning, tools)

        def parse(text: str, final: bool) -> tuple[Message, bool]:
            try:
                content, thought, calls = parser.parse(text, not final)
            except ValueError:
                if not final:
                    return Message(content=text), False
                return parse(text, False)
            return Message(content, thought, [Call(n, a, i) for n, a, i in calls]), final

        return parse


class _Worker:
    """One analysing child process, replaced whenever it fails or runs late."""

    def __init__(self):
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()

    async def _start(self) -> asyncio.subprocess.Process:
        if self.proc is None or self.proc.returncode is not None:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", f"{__package__}.format_worker", str(ANALYSIS_MEMORY), str(os.getpid()),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, limit=64 << 20)
        return self.proc

    def _kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
        self.proc = None

    async def run(self, request: dict, timeout: float) -> dict:
        async with self.lock:
            proc = await self._start()
            try:
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            except asyncio.TimeoutError:
                self._kill()
                raise _Failed(f"its analysis ran longer than {timeout:g} s "
                              f"({ANALYSIS_TIMEOUT_FACTOR} x inference.limits.template_timeout)") from None
            except (OSError, ValueError, asyncio.LimitOverrunError):
                self._kill()
                raise _Failed("its analysis failed") from None
            except BaseException:
                self._kill()                 # cancelled mid-answer: the next one starts clean
                raise
            if not line:
                self._kill()
                raise _Failed("its analysis crashed")
            answer = json.loads(line)
            if "error" in answer:
                raise _Failed(answer["error"])
            return answer["ok"]

    def close(self) -> None:
        self._kill()

    async def aclose(self) -> None:
        """Kill the child and reap it on this loop, so its transport closes here and not in a
        finalizer after the loop has gone."""
        proc = self.proc
        self._kill()
        if proc is not None:
            await proc.communicate()     # reads to EOF and closes stdin: every pipe is closed


class _Failed(Exception):
    pass


_worker: _Worker | None = None
_cache: collections.OrderedDict = collections.OrderedDict()


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


async def analyze(template, tools: ToolRequest | None, enable_thinking: bool, param: str) -> Analysis:
    """llama.cpp's analysis of `template` for these tools (cached); a failure is a 400 naming
    `param` ("tools", or "messages" when the template alone is at fault)."""
    global _worker
    offered = [t.as_openai() for t in tools.offered()] if tools is not None and tools.active else []
    choice = tools.choice if offered else "none"
    parallel = bool(offered) and tools.parallel
    key = _key(template.source, template.bos_token, template.eos_token, offered, choice, parallel,
               enable_thinking, 2)
    found = _cache.get(key)
    if found is not None:
        _cache.move_to_end(key)
        return found
    if _worker is None:
        _worker = _Worker()
    request = {"source": template.source, "bos": template.bos_token, "eos": template.eos_token,
               "messages_json": json.dumps(PROBE),
               "tools_json": json.dumps(offered) if offered else "",
               "tool_choice": choice, "parallel": parallel, "enable_thinking": enable_thinking,
               "extract_reasoning": True}
    timeout = ANALYSIS_TIMEOUT_FACTOR * _limits.current.template_timeout
    try:
        analysis = Analysis(await _worker.run(request, timeout))
        if choice == "required" and not analysis.grammar_lazy:
            analysis.grammar = call_at_once(analysis.grammar)
        if offered and not parallel:
            analysis.grammar = one_call(analysis.grammar)
    except _Failed as exc:
        raise invalid(f"the model's chat template could not be analysed for this request: {exc}",
                      param) from None
    _cache[key] = analysis
    if len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return analysis


_FREE_TEXT = re.compile(r"(?m)^(root ::= [^\n]*?) until-\d+\?( tool-calls?)$")


def call_at_once(grammar: str) -> str:
    """A required (or named) call begins the answer, after any thinking. llama.cpp's grammar lets
    free text come first (`root ::= prompt thinking? until-N? tool-calls`), which a small model
    spends its whole max_tokens on; the free text goes. A root of another shape is kept."""
    return _FREE_TEXT.sub(r"\1\2", grammar, count=1)


_CALLS = re.compile(r"(?m)^tool-calls ::= \(tool-call space\)\+$")


def one_call(grammar: str) -> str:
    """parallel_tool_calls false: one call. llama.cpp's grammar of some formats repeats the call
    whatever the switch (`tool-calls ::= (tool-call space)+`); once the call is whole, the grammar
    is complete and the answer ends."""
    return _CALLS.sub("tool-calls ::= tool-call space", grammar, count=1)


def close() -> None:
    if _worker is not None:
        _worker.close()


async def aclose() -> None:
    """Stop the analysing child and forget it (the daemon's shutdown, and tests between loops)."""
    global _worker
    if _worker is not None:
        worker, _worker = _worker, None
        await worker.aclose()


# ---- llama.cpp's message workarounds (common/chat.cpp), for our own rendering ---------------

def render_messages(messages: list[dict], caps: dict) -> list[dict]:
    """The conversation as llama.cpp hands it to a template of these capabilities."""
    out = []
    object_arguments = caps.get("supports_object_arguments", False)
    for message in messages:
        calls = message.get("tool_calls")
        if calls and object_arguments:
            message = {**message, "tool_calls": [
                {**c, "function": {**c["function"], "arguments": _object(c["function"]["arguments"])}}
                for c in calls]}
        out.append(message)
    if not caps.get("supports_system_role", True) and out and out[0]["role"] == "system":
        system, rest = out[0]["content"], out[1:]
        if rest and rest[0]["role"] == "user":
            rest = [{**rest[0], "content": f"{system}\n\n{rest[0]['content']}"}, *rest[1:]]
        out = rest
    return out


def _object(arguments: str):
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments
