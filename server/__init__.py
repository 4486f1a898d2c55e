"""stackd: an inference server for one device or a stack of devices."""

from . import native as _native

__version__ = "0.1.0"

if _native.pure_requested():
    _native.install_pure_finder()
