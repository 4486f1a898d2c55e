"""Each token's own text (its piece), for answers that list tokens one by one (/tokenize's
with_pieces and return_token_strs, prompt log-probabilities' alternatives come from the engine).

The model's vocabulary answers through its runner, which joins what it is given; a piece is
asked for once per distinct token of a text and kept per model (a vocabulary never changes
under a model id and digest), so a long text costs one lookup per distinct token."""
from __future__ import annotations

import asyncio

# distinct tokens asked for at once: a worker answers each as one small frame
BATCH = 256
# models whose pieces are kept (the most recently used), and pieces kept per model
MAX_MODELS = 4

_known: dict[str, dict[int, bytes]] = {}


async def of(runner, model_key: str, tokens: list[int]) -> list[bytes]:
    """The piece of each token, in order (ids already checked against the vocabulary)."""
    known = _known.pop(model_key, None) or {}
    _known[model_key] = known                 # most recently used last
    while len(_known) > MAX_MODELS:
        del _known[next(iter(_known))]
    missing = list(dict.fromkeys(t for t in tokens if t not in known))
    for start in range(0, len(missing), BATCH):
        batch = missing[start:start + BATCH]
        texts = await asyncio.gather(*(runner.detokenize([t]) for t in batch))
        known.update(zip(batch, texts))
    return [known[t] for t in tokens]


def shown(piece: bytes):
    """llama-server's `piece`: the text when the bytes are UTF-8, else the bytes as numbers (a
    character split over tokens)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)
