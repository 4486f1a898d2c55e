"""llama.cpp's family formats (stackd._chat through chat/formats.py): the analysis in its killable
child, the lazy grammar and its triggers, the parser read partially and whole, reasoning split
out, and hostile templates ending in a 400."""
import asyncio
import gc

import pytest

from stackd.chat import formats, limits
from stackd.chat.sandbox import ChatTemplate
from stackd.chat.tools import Tool, ToolRequest
from stackd.errors import DomainError
from stackd.serving.output import ARGUMENTS, REASONING, TEXT, TOOL
from stackd.serving.reader import Reader
from testing.gguf_patch import QWEN25_TOOLS, QWEN3_THINKING

QWEN = QWEN25_TOOLS
# A thinking template in Qwen3's manner: <think> in the history, switched by enable_thinking.
THINKING = (
    "{%- for message in messages %}{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' + "
    "message.content + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")
WEATHER = Tool("get_weather", "The weather", {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]})


def analyze(source, tools=None, thinking=True, param="tools"):
    """One analysis on its own event loop (the worker's pipes belong to one loop)."""
    template = ChatTemplate(source, "", "<|im_end|>")

    async def run():
        try:
            return await formats.analyze(template, tools, thinking, param)
        finally:
            await formats.aclose()

    analysis = asyncio.run(run())
    # The closed loop's cycles (futures, stream objects with finalizers) are collected here, not
    # inside a later test's ast.parse: a collection run within CPython 3.11.7's AST builder
    # trips its recursion check (SystemError "AST constructor recursion depth mismatch").
    gc.collect()
    return analysis


def stream(parse, text: str) -> list:
    """The typed pieces of `text` fed three characters at a time."""
    reader, pieces = Reader(parse), []
    for i in range(0, len(text), 3):
        pieces += reader.feed(text[i:i + 3])
    return pieces


@pytest.fixture(autouse=True)
def fresh_worker():
    yield
    formats.close()
    formats._worker = None
    formats._cache.clear()


def test_hermes_template_gets_a_lazy_grammar_triggered_by_tool_call():
    template = ChatTemplate(QWEN, "", "<|im_end|>")
    assert formats.reads_tools(template)
    analysis = analyze(QWEN, ToolRequest((WEATHER,), "auto"))
    assert analysis.grammar and analysis.grammar_lazy
    assert any("tool_call" in t for t in analysis.triggers)
    assert analysis.caps["supports_tool_calls"] and analysis.caps["supports_object_arguments"]


def test_required_is_not_lazy():
    analysis = analyze(QWEN, ToolRequest((WEATHER,), "required"))
    assert analysis.grammar and not analysis.grammar_lazy


def test_the_family_parser_reads_calls_whole_and_streamed():
    parse = analyze(QWEN, ToolRequest((WEATHER,), "auto")).parse_function(True, False)
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    message, complete = parse(text, True)
    assert complete and message.content.strip() == "Let me look."
    assert [(c.name, c.arguments) for c in message.calls] == [("get_weather", '{"city": "Paris"}')]
    pieces = stream(parse, text)
    opened = [p for p in pieces if p.kind == TOOL]
    assert [(p.name, p.call) for p in opened] == [("get_weather", 0)] and opened[0].id.startswith("call_")
    assert "".join(p.text for p in pieces if p.kind == ARGUMENTS and p.call == 0) == '{"city": "Paris"}'


def test_reasoning_is_split_out_of_content_and_streamed_apart():
    analysis = analyze(THINKING)
    assert analysis.supports_thinking and analysis.thinking_start == "<think>"
    parse = analysis.parse_function(False, True)
    text = "<think>\nThe user greets me.\n</think>\n\nHello!"
    message = Reader(parse).message(text, "stop", None, None)
    assert message.finish == "stop" and not message.calls and message.content == "Hello!"
    assert message.reasoning.strip() == "The user greets me."
    pieces = stream(parse, text)
    thought = "".join(p.text for p in pieces if p.kind == REASONING)
    content = "".join(p.text for p in pieces if p.kind == TEXT)
    assert thought.strip() == "The user greets me." and content == "Hello!"
    first_content = next(i for i, p in enumerate(pieces) if p.kind == TEXT)
    assert all(p.kind != TEXT for p in pieces[:first_content])


def test_thinking_switched_off_renders_the_empty_think_block():
    template = ChatTemplate(THINKING, "", "<|im_end|>")
    on = template.render([{"role": "user", "content": "hi"}], limits.current, {"enable_thinking": True})
    off = template.render([{"role": "user", "content": "hi"}], limits.current, {"enable_thinking": False})
    assert off == on + "<think>\n\n</think>\n\n"
    assert analyze(THINKING, thinking=False).generation_prompt.endswith(b"</think>\n\n")


def test_a_template_that_loops_in_the_analysis_is_a_400_and_the_worker_is_replaced(monkeypatch):
    monkeypatch.setattr(limits, "current", limits.InferenceLimits(template_timeout=0.05))
    looping = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
               "{{ tools }}")
    with pytest.raises(DomainError) as refused:
        analyze(looping, ToolRequest((WEATHER,), "auto"))
    assert refused.value.param == "tools" and "longer than" in refused.value.message
    monkeypatch.setattr(limits, "current", limits.InferenceLimits())
    assert analyze(QWEN, ToolRequest((WEATHER,), "auto")).grammar   # a new worker answers


def test_a_template_llama_cpp_cannot_take_is_a_400():
    with pytest.raises(DomainError) as refused:
        analyze("{% for %}", ToolRequest((WEATHER,), "auto"))
    assert refused.value.param == "tools"


def test_a_required_call_begins_the_answer_and_is_one_unless_parallel():
    """llama.cpp's required grammar lets free text come first and repeats the call; ours starts
    with the call (after any thinking) and holds one call unless parallel_tool_calls."""
    calls = ToolRequest((WEATHER,), "required", None, False)
    grammar = analyze(QWEN, calls).grammar
    root = next(line for line in grammar.splitlines() if line.startswith("root ::="))
    assert "until" not in root and root.endswith(" tool-calls")
    assert "tool-calls ::= tool-call space" in grammar
    thinking = analyze(QWEN3_THINKING, calls).grammar
    root = next(line for line in thinking.splitlines() if line.startswith("root ::="))
    assert '"</think>"' in root and not root.split('"</think>"')[1].count("until")
    parallel = analyze(QWEN, ToolRequest((WEATHER,), "required", None, True)).grammar
    assert "tool-calls ::= (tool-call space)+" in parallel
    assert formats.call_at_once("root ::= other\n") == "root ::= other\n"   # another shape: kept
