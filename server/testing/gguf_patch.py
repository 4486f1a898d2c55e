"""Copies of the default chat model with another chat template, for attack tests.

The template is swapped in place: the new one is padded with a Jinja comment to the old one's
length, so no offset in the file moves and the copy stays a valid GGUF.
"""
from __future__ import annotations

import shutil
import struct

from ..store import defaults

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
# by the last message (tests/blackbox/test_attacks.py, bench/hostile.py).
HOSTILE = "hostile-template"
HOSTILE_TEMPLATE = (
    "{% set c = messages[-1]['content'] %}"
    "{% if c == 'loop' %}{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    "{% elif c == 'mem' %}{{ 'x' * 300000000 }}"
    "{% elif c == 'range' %}{{ range(1000000) | list | length }}{% endif %}"
    "<|im_start|>user\n{{ c }}<|im_end|>\n<|im_start|>assistant\n")
