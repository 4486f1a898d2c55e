"""Chat prompts from the GGUF's own chat template, rendered off the event loop in a sandbox.

The template is compiled once per model (sandbox.ChatTemplate: bounded time, operations and
memory). Each chat request renders it, and tokenizes the result, on a small pool of render
threads: a template is code from a model file running on client data, and a large prompt takes
milliseconds to tokenize, so neither may run on the loop that serves every other client.
Whatever goes wrong in a template is a 400 that says so, never a 500.
"""
from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from ..errors import invalid
from . import limits
from .sandbox import ChatTemplate, TemplateFailure

# ChatML, for models whose GGUF carries no template.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

RENDER_THREADS = 2
RENDER_NICE = 10


def _lower_priority() -> None:
    """Render threads yield the CPU to the engines' threads (a hostile template burns CPU up
    to its time limit; generation for everyone else should not pay for it). Only templates run
    here: other off-loop work goes to offload.py, at the loop's priority (see why there)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RENDER_NICE)
    except OSError:
        pass


_pool = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="stackd-render",
                           initializer=_lower_priority)


def template_for(engine) -> ChatTemplate:
    eos = engine.piece(engine.token_eos).decode("utf-8", "replace") if engine.token_eos >= 0 else ""
    bos = engine.piece(engine.token_bos).decode("utf-8", "replace") if engine.token_bos >= 0 else ""
    return ChatTemplate(engine.chat_template or CHATML, bos_token=bos, eos_token=eos)


def _render_and_tokenize(template: ChatTemplate, messages: list[dict], runner, limit,
                         extra: dict | None) -> list[int]:
    text = template.render(messages, limit, extra)
    with runner.lease():
        return runner.engine.tokenize(text, False, True)


async def prompt_tokens(model, messages: list[dict], extra: dict | None = None) -> list[int]:
    """The tokens of the rendered conversation, computed on a render thread. `extra`: more
    variables for the template (tools, enable_thinking)."""
    runner = model.runner
    runner.check_open()
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_pool, _render_and_tokenize, model.template, messages,
                                          runner, limits.current, extra)
    except TemplateFailure as exc:
        raise invalid(f"the model's chat template failed for these messages: {exc}",
                      "messages") from None
