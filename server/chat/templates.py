"""Chat prompts from the GGUF's own chat template, rendered off the event loop in a sandbox.

The template is compiled once per model (sandbox.ChatTemplate: bounded time, operations and
memory). Each chat request renders it on a small pool of render threads (a template is code
from a model file running on client data: never on the loop that serves every other client),
and the text goes to the model's worker with the submit, to be tokenized there (one hop).
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


def template_for(facts: dict) -> ChatTemplate:
    """The model's template (engine.core.template_facts), compiled; ChatML when it has none."""
    return ChatTemplate(facts["chat_template"] or CHATML, bos_token=facts["bos_text"],
                        eos_token=facts["eos_text"])


def warm(template: ChatTemplate) -> None:
    """Render a short conversation once on the render pool, while the model loads: the pool's
    threads start and the template's first render (its caches) happen before a first request."""
    _pool.submit(_warm_render, template, limits.current)


def _warm_render(template: ChatTemplate, limit) -> None:
    try:
        template.render([{"role": "user", "content": "Hi"}], limit, None)
    except TemplateFailure:
        pass                       # a template that fails says so to the first real request


async def render(model, messages: list[dict], extra: dict | None = None) -> str:
    """The conversation as the model's prompt text, rendered on a render thread. `extra`: more
    variables for the template (tools, enable_thinking). The text is tokenized where the
    vocabulary is, with the submit (engine/submission.py), with special tokens parsed and none
    added (the template writes them)."""
    model.runner.check_open()
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(_pool, model.template.render, messages, limits.current, extra)
    except TemplateFailure as exc:
        raise invalid(f"the model's chat template failed for these messages: {exc}",
                      "messages") from None


async def prompt_tokens(model, messages: list[dict], extra: dict | None = None) -> list[int]:
    """The tokens of the rendered conversation, tokenized by the model's runner (a token count,
    /tokenize: requests that generate send the text with their submit instead)."""
    text = await render(model, messages, extra)
    return (await model.runner.tokenize([text], False, True))[0]
