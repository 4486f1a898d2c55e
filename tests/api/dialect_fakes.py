"""A fake chat.ChatRun for the dialect tests: the layer under test is the rendering, so the
run answers what a test gives it, in the typed output every dialect renders (serving/output.py)."""
import orjson

from stackd.http.errors import ApiError, ErrorKind
from stackd.serving.output import ARGUMENTS, REASONING, TEXT, TOOL, Call, Message, Piece, Step

USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
         "prompt_tokens_details": {"cached_tokens": 2}}


def answer(content="", reasoning=None, calls=(), finish="stop") -> Message:
    """A whole answer, as ChatRun.result() gives it."""
    return Message(reasoning or "", content if content or not calls else None,
                   [Call(id_, name, args) for id_, name, args in calls], finish, None, None)


def deltas(reasoning=(), text=(), calls=(), finish="stop") -> list:
    """Pieces: reasoning pieces, text pieces, then each call (id, name, argument pieces); last
    the finish reason."""
    out = [Piece(REASONING, piece) for piece in reasoning]
    out += [Piece(TEXT, piece) for piece in text]
    for index, (id_, name, pieces) in enumerate(calls):
        out.append(Piece(TOOL, call=index, id=id_, name=name))
        out += [Piece(ARGUMENTS, p, call=index) for p in pieces]
    return out + [finish]


class FakeRun:
    """The steps of one choice, from `deltas` (a Step per piece, the finish reason a Step of
    its own); `finish_step`: a last Step's (finish, stop) to send after them."""

    def __init__(self, deltas=(), fail_after=None):
        self._deltas, self.fail_after = list(deltas), fail_after
        self.closed = False
        self.finish_step = None

    async def steps(self):
        try:
            for i, delta in enumerate(self._deltas):
                if i == self.fail_after:
                    raise ApiError(ErrorKind.UNAVAILABLE, "the model's worker was lost")
                if isinstance(delta, str):        # the finish reason
                    yield Step(0, None, [], None, finish=delta)
                else:
                    yield Step(0, None, [delta], None)
            if self.finish_step is not None:
                yield Step(0, None, [], None, *self.finish_step)
        finally:
            self.closed = True

    def usage(self) -> dict:
        return USAGE

    def cancel(self):
        pass


async def gather(stream) -> list[tuple[str, dict]]:
    """A named-event stream's (event, data) pairs."""
    out = []
    async for raw in stream:
        head, data = raw.decode().strip().split("\n")
        assert head.startswith("event: ") and data.startswith("data: ")
        out.append((head[7:], orjson.loads(data[6:])))
    return out
