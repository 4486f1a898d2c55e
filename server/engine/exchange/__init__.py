"""The tensor split's exchange: a persistent, authenticated mesh between the engine workers of
a tensor-parallel placement, and the all-reduce that runs over it (docs/cluster.md, "Tensor
split: the exchange"). `frames` is the wire (parsed by one fuzzed reader), `mesh` the links."""
from .frames import FrameError
from .mesh import ExchangeError, Mesh, listen

__all__ = ["ExchangeError", "FrameError", "Mesh", "listen"]
