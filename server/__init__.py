"""stackd: an inference server for one device or a stack of devices."""

from . import compiled as _compiled

__version__ = "0.1.0"
# `stackd` once installed; `server` when a checkout runs `python -m server`. Child processes
# (engine workers, RPC servers) are started as modules of the same package.
PACKAGE = __name__

if _compiled.pure_requested():
    _compiled.install_pure_finder()
