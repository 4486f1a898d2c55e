"""Durations as Ollama's keep_alive takes them: a number of seconds, or a string of numbers
with units ("5m", "1h30m", "90s", "500ms", "-1"), a plain numeric string being seconds. Any
negative duration means "never" (NEVER); zero is "at once"."""
from __future__ import annotations

import math
import re

NEVER = -1.0
MAX_SECONDS = 10 * 365 * 86400.0      # ten years: longer is a typo, not a keep-alive
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


class DurationError(ValueError):
    pass


def seconds(value) -> float:
    """`value` in seconds (NEVER for a negative one); DurationError says what is wrong."""
    if isinstance(value, bool):
        raise DurationError("a duration is a number of seconds or a string such as \"5m\", not a boolean")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        number = _parse(value.strip())
    else:
        raise DurationError("a duration is a number of seconds or a string such as \"5m\"")
    if math.isnan(number) or math.isinf(number):
        raise DurationError("a duration must be finite")
    if number < 0:
        return NEVER
    if number > MAX_SECONDS:
        raise DurationError(f"a duration is at most {MAX_SECONDS:g} seconds (ten years); "
                            "a negative one means never")
    return number


def _parse(text: str) -> float:
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    try:
        return sign * float(body)         # "300": seconds
    except ValueError:
        pass
    parts = _PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise DurationError(f"{text!r} is not a duration: use seconds or numbers with units "
                            "h, m, s, ms, such as \"5m\" or \"1h30m\"")
    return sign * sum(float(number) * UNITS[unit] for number, unit in parts)


def shown(value: float) -> str:
    """A duration in words for messages: "never", or seconds."""
    return "never" if value < 0 else f"{value:g} s"
