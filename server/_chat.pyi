"""Type stub for stackd._chat (native/chat/bindings.cpp): llama.cpp's common/ chat formats.

`analyze` runs llama.cpp's C++ jinja runtime, which has no bound: only in the killable child
(chat/format_worker.py), never in the daemon. `Parser.parse` only reads generated text."""
from typing import Any, TypedDict

class Analysis(TypedDict):
    caps: dict[str, bool]
    supports_enable_thinking: bool
    format: int
    format_name: str
    prompt: bytes
    grammar: str
    grammar_lazy: bool
    trigger_patterns: list[str]      # regexes over the output text (token triggers as their text)
    preserved_tokens: list[str]
    additional_stops: list[str]
    parser: bytes                    # the serialized PEG parser, for Parser
    generation_prompt: bytes
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: list[str]

def analyze(source: str, bos: str, eos: str, messages_json: str, tools_json: str,
            tool_choice: str, parallel: bool, enable_thinking: bool,
            extract_reasoning: bool) -> Analysis: ...   # RuntimeError etc.: llama.cpp's words

def json_schema_to_grammar(schema_json: str) -> str: ...   # ValueError: a schema it cannot convert

class Parser:
    def __init__(self, format: int, serialized: bytes, generation_prompt: bytes,
                 extract_reasoning: bool, parse_tool_calls: bool) -> None: ...
    # (content, reasoning, [(name, arguments, id)]); ValueError: a whole text that does not parse
    def parse(self, text: str, partial: bool) -> tuple[str, str, list[tuple[str, str, str]]]: ...
