"""Copies of the default chat model with another chat template, for attack tests.

The template is swapped in place: the new one is padded with a Jinja comment to the old one's
length, so no offset in the file moves and the copy stays a valid GGUF.
"""
from __future__ import annotations

import shutil
import struct

from stackd.store import defaults

KEY = b"tokenizer.chat_template"
GGUF_STRING = 8


def with_chat_template(template: str, path: str) -> str:
    shutil.copyfile(defaults.smollm2_path(), path)
    with open(path, "r+b") as f:
        head = f.read(8 << 20)
        at = head.find(KEY) + len(KEY)
        value_type, length = struct.unpack("<IQ", head[at:at + 12])
        assert value_type == GGUF_STRING
        new = template.encode()
        padding = length - len(new) - len("{##}")
        if padding < 0:
            raise ValueError(f"template is {len(new)} bytes; at most {length - 4} fit")
        f.seek(at + 12)
        f.write(new + b"{#" + b" " * padding + b"#}")
    return path


# A model whose chat template attacks the renderer: loops, a huge string, a huge range, chosen
# by the last message (tests/blackbox/test_hostile.py, bench/hostile.py).
HOSTILE = "hostile-template"
HOSTILE_TEMPLATE = (
    "{% set c = messages[-1]['content'] %}"
    "{% if c == 'loop' %}{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    "{% elif c == 'mem' %}{{ 'x' * 300000000 }}"
    "{% elif c == 'range' %}{{ range(1000000) | list | length }}{% endif %}"
    "<|im_start|>user\n{{ c }}<|im_end|>\n<|im_start|>assistant\n")


def rewritten_with_chat_template(template: str, path: str) -> str:
    """A copy of the default chat model whose tokenizer.chat_template is `template`, whatever its
    length: every other key and every tensor copied by the gguf package into a new file."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(defaults.smollm2_path(), "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(path, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(
        gguf.GGUFValueType.STRING, template)}, [])
    return path


# Qwen 2.5's tool template (Hermes <tool_call> JSON), trimmed to its tool parts.
QWEN25_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}"
    "{{- messages[0].content + '\\n\\n' }}{%- endif %}{{- '# Tools\\n\\nYou may call one or more "
    "functions to assist with the user query.\\n\\nYou are provided with function signatures "
    "within <tools></tools> XML tags:\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}"
    "{{- tool | tojson }}{%- endfor %}{{- '\\n</tools>\\n\\nFor each function call, return a json "
    "object with function name and arguments within <tool_call></tool_call> XML tags:\\n"
    "<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>"
    "<|im_end|>\\n' }}{%- else %}{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' "
    "+ messages[0].content + '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}{{- '<|im_start|>' + message.role + "
    "'\\n' + message.content + '<|im_end|>' + '\\n' }}{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\\n' + message.content }}"
    "{%- endif %}{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{\"name\": \"' }}"
    "{{- tool_call.name }}{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}"
    "{{- '<|im_start|>user' }}{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}"
    "{{- '\\n</tool_response>' }}{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# A thinking template in the manner of Qwen3's thinking models: the same tools, the thinking of
# past turns in <think>, and a generation prompt that opens the thinking ("<think>\n"), or closes
# it at once when enable_thinking is false. (The default model never writes <think> itself; the
# prompt opening it is what makes it think here.)
QWEN3_THINKING = QWEN25_TOOLS.split("{%- for message in messages %}")[0] + (
    "{%- for message in messages %}{%- if message.role == 'user' or message.role == 'system' and "
    "not loop.first %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + "
    "'\\n</think>\\n\\n' }}{%- endif %}{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{\"name\": \"' + "
    "tool_call.name + '\", \"arguments\": ' + (tool_call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n"
    "<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}")
