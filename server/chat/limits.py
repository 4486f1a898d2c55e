"""Limits on what one request may make the daemon do (settings `inference.limits.*`).

Process-wide, set once at start-up by the daemon (`configure`), read where the work happens:
the grammar budget (grammar.py), the chat template sandbox (sandbox.py) and the engines' fair
share. Every one is documented in docs/hostile-input.md with its error.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class InferenceLimits:
    key_share: float = 0.5            # most of a model's slots and queue one API key may hold
    schema_max_depth: int = 32        # nesting of a response_format JSON schema
    schema_max_nodes: int = 2048      # objects and arrays in that schema
    grammar_max_repeat: int = 1000    # maxLength, minLength, minItems, maxItems, pattern {m,n}
    grammar_max_enum: int = 256       # values of one enum
    grammar_max_rules: int = 512      # rules of the grammar after conversion
    grammar_max_bytes: int = 65536    # size of the grammar after conversion
    template_max_ops: int = 1_000_000 # calls, attribute and item lookups, operators, loop items
    template_max_items: int = 100_000 # range() length, and items of a list a template builds
    template_max_bytes: int = 4 << 20 # a string a template builds, and its whole output
    template_timeout: float = 1.0     # seconds one rendering may take

    @classmethod
    def defaults(cls) -> dict:
        return {f.name: f.default for f in fields(cls)}


current = InferenceLimits()


@dataclass(frozen=True)
class ReasoningBudget:
    """Thinking tokens an answer may spend per `reasoning_effort` (settings
    `inference.reasoning_budget.*`; -1: no bound), so a small thinking model cannot spend a
    device's whole answer thinking: past it the engine forces the template's end-of-thinking tag
    and the answer goes on. 'none' switches the template's thinking off and forces the tag at
    once should the model think anyway. A request without reasoning_effort gets `medium`."""
    minimal: int = 64
    low: int = 256
    medium: int = 1024
    high: int = 4096

    @classmethod
    def defaults(cls) -> dict:
        return {f.name: f.default for f in fields(cls)}

    def of(self, effort: str | None) -> int:
        if effort == "none":
            return 0
        return getattr(self, effort or "medium")


reasoning_budget = ReasoningBudget()


def configure(values: dict, budget: dict | None = None) -> InferenceLimits:
    global current, reasoning_budget
    current = InferenceLimits(**values)
    reasoning_budget = ReasoningBudget(**(budget or {}))
    return current
