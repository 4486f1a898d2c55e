"""One choice's generated text read back into an answer: as pieces while it grows (`feed`, for
streams), and as a Message once it is whole (`message`).

`parse(text, final) -> (chat.tools.Message, complete)` is the chat format's reader (a model
family's tool-call and reasoning syntax, chat/formats.py; or the generic JSON call,
chat/tools.py); without one, the text is the answer's content as generated.
"""
from __future__ import annotations

from ..chat import tools as chat_tools
from .output import ARGUMENTS, REASONING, TEXT, TOOL, Call, Message, Piece, new_id


class Reader:
    __slots__ = ("parse", "text", "seen", "ids")

    def __init__(self, parse):
        self.parse = parse
        self.text = ""
        self.seen = chat_tools.Message()
        self.ids: list[str] = []

    def _id(self, index: int, call: chat_tools.Call) -> str:
        while len(self.ids) <= index:
            self.ids.append(call.id or new_id("call"))
        return self.ids[index]

    @property
    def called(self) -> bool:
        return bool(self.seen.calls)

    def feed(self, text: str) -> list[Piece]:
        """The pieces the new text adds: reasoning, content, then each call (it opens with its
        name, then fragments of its arguments)."""
        self.text += text
        new, _ = self.parse(self.text, False)
        seen, out = self.seen, []
        if len(new.reasoning) > len(seen.reasoning):
            out.append(Piece(REASONING, new.reasoning[len(seen.reasoning):]))
        if len(new.content) > len(seen.content):
            out.append(Piece(TEXT, new.content[len(seen.content):]))
        for i, call in enumerate(new.calls):
            if i >= len(seen.calls):
                out.append(Piece(TOOL, call=i, id=self._id(i, call), name=call.name))
                done = ""
            else:
                done = seen.calls[i].arguments
            if len(call.arguments) > len(done):
                out.append(Piece(ARGUMENTS, call.arguments[len(done):], call=i))
        self.seen = new
        return out

    def message(self, text: str, finish: str | None, stop: str | None, choice) -> Message:
        """The whole answer; an answer that ended by itself after calling tools finished for
        "tool_calls"."""
        self.text = text
        new, complete = self.parse(text, True)
        if not complete and not new.calls and not new.content and not new.reasoning:
            return Message("", text, [], finish, stop, choice)    # cut short before anything could be read
        calls = [Call(self._id(i, c), c.name, c.arguments) for i, c in enumerate(new.calls)]
        return Message(new.reasoning, new.content or (None if calls else ""), calls,
                       finished_for(finish, bool(calls)), stop, choice)


def finished_for(reason: str | None, called: bool) -> str | None:
    """An answer that ended by itself after calling tools finished for "tool_calls"."""
    return "tool_calls" if called and reason == "stop" else reason
