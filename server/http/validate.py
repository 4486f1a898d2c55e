"""Field checks for JSON bodies. Each failure is a 400 that names the field."""
from __future__ import annotations

from .errors import invalid

_MISSING = object()


def _type_name(value) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def string(body: dict, field: str, *, required: bool = True, default=None, max_len: int = 4096,
           allow_empty: bool = False):
    value = body.get(field, _MISSING)
    if value is _MISSING or (value is None and not required):
        if required:
            raise invalid(f"'{field}' is required", field)
        return default
    if not isinstance(value, str):
        raise invalid(f"'{field}' must be a string, not {_type_name(value)}", field)
    if not value and not allow_empty:
        raise invalid(f"'{field}' must not be empty", field)
    if len(value) > max_len:
        raise invalid(f"'{field}' is longer than {max_len} characters", field)
    return value


def integer(body: dict, field: str, *, lo: int, hi: int, default=None, required: bool = False):
    value = body.get(field, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise invalid(f"'{field}' is required", field)
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{field}' must be an integer, not {_type_name(value)}", field)
    if not lo <= value <= hi:
        raise invalid(f"'{field}' must be between {lo} and {hi}, got {value}", field)
    return value


def number(body: dict, field: str, *, lo: float, hi: float, default=None):
    value = body.get(field, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{field}' must be a number, not {_type_name(value)}", field)
    if not lo <= value <= hi:   # also false for NaN
        raise invalid(f"'{field}' must be between {lo} and {hi}, got {value}", field)
    return float(value)


def boolean(body: dict, field: str, *, default: bool = False) -> bool:
    value = body.get(field, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{field}' must be a boolean, not {_type_name(value)}", field)
    return value


def obj(body: dict, field: str, *, default=None):
    value = body.get(field, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, dict):
        raise invalid(f"'{field}' must be an object, not {_type_name(value)}", field)
    return value
