"""Chat prompts from the GGUF's own chat template, rendered in a sandbox.

llama-cpp-python's Jinja2ChatFormatter renders with jinja2's
ImmutableSandboxedEnvironment: a template cannot reach Python internals, mutate
its inputs or load other templates.
"""
from __future__ import annotations

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from ..http.errors import invalid

# ChatML, for models whose GGUF carries no template.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def formatter_for(engine) -> Jinja2ChatFormatter:
    template = engine.chat_template or CHATML
    eos = engine.piece(engine.token_eos).decode("utf-8", "replace") if engine.token_eos >= 0 else ""
    bos = engine.piece(engine.token_bos).decode("utf-8", "replace") if engine.token_bos >= 0 else ""
    return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)


def render(formatter: Jinja2ChatFormatter, messages: list[dict]) -> str:
    try:
        return formatter(messages=messages).prompt
    except jinja2.exceptions.SecurityError:
        raise invalid("the chat template tried an operation the sandbox forbids") from None
    except (jinja2.exceptions.TemplateError, ValueError, TypeError) as exc:
        raise invalid(f"the chat template rejected these messages: {exc}", "messages") from None
