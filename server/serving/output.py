"""The typed output of a generation run, as every dialect renders it.

A run (api/inference/chat.py ChatRun) yields a Step per engine event of a choice: the pieces it
added to the answer (the reader's, reader.py) and its token log-probabilities. Chat completions
render steps as chunks; dialects that speak in content blocks (Responses, Messages) take them as
block events (`block_events`): a block opens when the kind of what arrives changes and closes
when the next one opens, each tool call a block of its own. Whole answers are one Message per
choice, and `blocks_of` lays one out as the same blocks. Nothing here is a dialect's dict: no
dialect parses another's output back.
"""
from __future__ import annotations

import contextlib
import os

REASONING, TEXT, TOOL = "reasoning", "text", "tool"
ARGUMENTS = "arguments"          # a piece: more of a tool call's arguments
OPEN, DELTA, CLOSE, END = "open", "delta", "close", "end"


def new_id(prefix: str) -> str:
    """An id as the dialects spell them: msg_..., resp_..., call_..."""
    return f"{prefix}_{os.urandom(12).hex()}"


class Piece:
    """What one step added to a choice's answer: `kind` REASONING or TEXT with `text`; TOOL (a
    call opens: `call` its index among the calls, `id`, `name`); ARGUMENTS (`call`, `text`)."""

    __slots__ = ("kind", "text", "call", "id", "name")

    def __init__(self, kind: str, text: str = "", call: int = 0, id: str = "", name: str = ""):
        self.kind, self.text, self.call, self.id, self.name = kind, text, call, id, name


class Step:
    """One engine event of one choice, as the answer sees it. `choice`: what the choice has
    produced so far (api/inference/responses.Choice), its finish_reason set at its last step;
    `finish`: the reason as the answer reports it ("tool_calls" for an answer that called
    tools), None before the last step; `stop`: the client's stop string that ended it."""

    __slots__ = ("index", "choice", "pieces", "logprobs", "finish", "stop")

    def __init__(self, index: int, choice, pieces: list[Piece], logprobs, finish: str | None = None,
                 stop: str | None = None):
        self.index, self.choice, self.pieces, self.logprobs = index, choice, pieces, logprobs
        self.finish, self.stop = finish, stop


class Call:
    __slots__ = ("id", "name", "arguments")

    def __init__(self, id: str, name: str, arguments: str):
        self.id, self.name, self.arguments = id, name, arguments


class Message:
    """One choice's whole answer: `content` None when it only called tools."""

    __slots__ = ("reasoning", "content", "calls", "finish", "stop", "choice")

    def __init__(self, reasoning: str, content: str | None, calls: list[Call], finish: str | None,
                 stop: str | None, choice):
        self.reasoning, self.content, self.calls = reasoning, content, calls
        self.finish, self.stop, self.choice = finish, stop, choice


class Block:
    """One piece of the answer as a content block: reasoning, text, or one tool call (`id`,
    `name`; its text is the arguments, a JSON string). `index`: its place among the blocks."""

    __slots__ = ("kind", "index", "id", "name", "parts")

    def __init__(self, kind: str, index: int, id: str = "", name: str = ""):
        self.kind, self.index, self.id, self.name = kind, index, id, name
        self.parts: list[str] = []

    def text(self) -> str:
        return "".join(self.parts)


def blocks_of(message: Message) -> list[Block]:
    """A whole answer's blocks: its reasoning, its text, then each call."""
    blocks: list[Block] = []
    for kind, text in ((REASONING, message.reasoning), (TEXT, message.content)):
        if text:
            blocks.append(Block(kind, len(blocks)))
            blocks[-1].parts.append(text)
    for call in message.calls:
        block = Block(TOOL, len(blocks), call.id or new_id("call"), call.name)
        block.parts.append(call.arguments)
        blocks.append(block)
    return blocks


async def block_events(steps, usage):
    """The first choice's steps as (OPEN, block), (DELTA, block, text), (CLOSE, block), and last
    (END, finish reason, usage, stop string or None); `usage()`: the run's usage once it is over
    (the dialects answer one choice)."""
    current: Block | None = None
    calls: dict[int, Block] = {}
    count = 0
    reason, stop = None, None
    async with contextlib.aclosing(steps):     # closing this closes the run's steps
        async for step in steps:
            if step.index != 0:
                continue
            for piece in step.pieces:
                kind = piece.kind
                if kind in (REASONING, TEXT):
                    if not piece.text:
                        continue
                    if current is None or current.kind != kind:
                        if current is not None:
                            yield CLOSE, current
                        current = Block(kind, count)
                        count += 1
                        yield OPEN, current
                    current.parts.append(piece.text)
                    yield DELTA, current, piece.text
                elif kind == TOOL:
                    if current is not None:
                        yield CLOSE, current
                    current = calls[piece.call] = Block(TOOL, count, piece.id or new_id("call"), piece.name)
                    count += 1
                    yield OPEN, current
                else:
                    block = calls.get(piece.call)
                    if block is not None and piece.text:
                        block.parts.append(piece.text)
                        yield DELTA, block, piece.text
            if step.finish is not None:
                reason, stop = step.finish, step.stop
    if current is not None:
        yield CLOSE, current
    yield END, reason, usage(), stop
