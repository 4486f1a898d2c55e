"""`response_format` JSON schemas turned into GBNF, within a budget checked before llama.cpp.

A schema's size is not its cost. `{"type": "string", "maxLength": 20000}` is 50 bytes and
becomes 20,000 nested optional groups, which llama.cpp's recursive grammar parser cannot
survive (the stack overflows and the process dies); `minItems: 5000000` takes seconds and
hundreds of MiB to convert; a 3,000-value enum makes every sampled token expensive. So the
schema is walked first (depth, size, repetition counts, enum sizes, only local `$ref`s), then
converted, then the grammar itself is measured (rules, bytes, nesting). Every refusal is a 400
naming the limit and its setting (`inference.limits.*`).
"""
from __future__ import annotations

import math
import re

import orjson
from .gbnf import json_schema_to_gbnf

from ..errors import invalid
from . import limits as _limits

PARAM = "response_format"
REPEAT_KEYWORDS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties",
                   "minProperties", "maxContains", "minContains")
# Bounds a schema gives as a pair: an upper one below the lower one matches nothing (and would
# reach llama.cpp as a repetition {m,n} with n < m, see reversed_bounds).
MIN_MAX_KEYWORDS = (("minLength", "maxLength"), ("minItems", "maxItems"),
                    ("minProperties", "maxProperties"), ("minContains", "maxContains"))
# {m}, {m,} and {m,n} quantifiers in a `pattern`: each becomes a repetition in the grammar.
QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
# llama.cpp's grammar parser recurses once per nested group; 20,000 levels overflow its stack.
# This bound is far below that whatever the settings say.
MAX_GRAMMAR_NESTING = 4096


# Repetitions nested in a `pattern` multiply: `(a{0,30}){0,30}` can split a run of a's in 900
# ways, and llama.cpp's grammar keeps a parse stack for each while it checks every candidate
# token (one sample of `((a{0,30}){0,30}){0,30}` held the engine for minutes). Delimiters keep
# nested arrays and objects unambiguous; a regex has none. Fixed, far below what stalls a step.
MAX_NESTED_REPEAT = 100


def nested_repeat(pattern: str) -> int:
    """The largest product of the upper bounds of repetitions nested two or more deep in a
    regex (`{m,n}` counts n, `{m}` and `{m,}` count m; `*`, `+` and `?` count 1: llama.cpp
    refuses the left recursion a nullable loop inside a loop makes). One level costs nothing
    here: `a{0,900}` is one parse stack whatever the run (grammar_max_repeat bounds it)."""
    groups = [(1, 0)]             # per open group, its costliest element: (product, levels)
    last = (1, 0)                 # the element just read, which a quantifier scales
    worst = 1
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\" or ch == "[":
            i = i + 2 if ch == "\\" else _class_end(pattern, i)
            last = (1, 0)
            continue
        if ch == "(":
            groups.append((1, 0))
        elif ch == ")" and len(groups) > 1:
            last = groups.pop()
            groups[-1] = max(groups[-1], last)
        elif ch == "{" and (match := QUANTIFIER.match(pattern, i)):
            low, high = match.groups()
            last = (last[0] * max(1, int(high) if high else int(low)), last[1] + 1)
            groups[-1] = max(groups[-1], last)
            if last[1] >= 2:
                worst = max(worst, last[0])
            i = match.end()
            continue
        elif ch not in "*+?|":
            last = (1, 0)
        i += 1
    return worst


def reversed_range(pattern: str) -> str | None:
    """The first range of a character class in a regex whose end comes before its start
    (`[5-1]`): it matches nothing, and the grammar made of it allows no first token."""
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] != "[":
            i += 1
            continue
        end = _class_end(pattern, i)
        members = _class_members(pattern[i + 1:end - 1].removeprefix("^"))
        for a, dash, b in zip(members, members[1:], members[2:]):
            if dash == "-" and len(a) == len(b) == 1 and a != "-" and a > b:
                return f"{a}-{b}"
        i = end
    return None


def _class_members(body: str) -> list[str]:
    """A class's characters, an escaped punctuation mark as itself; other escapes (\\d, \\n) and
    an escaped '-' stay two characters, never read as a range or its end."""
    members, i = [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            ch = body[i + 1]
            members.append(ch if ch in "]\\^[.$*+?(){}|/" else "\\" + ch)
            i += 2
        else:
            members.append(body[i])
            i += 1
    return members


def _class_end(pattern: str, i: int) -> int:
    """The index past the character class that opens at i."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _too_big(what: str, limit: int, setting: str, param: str = PARAM) -> None:
    raise invalid(f"the JSON schema in '{param}' is too large: {what} (the limit is "
                  f"{limit}, setting inference.limits.{setting})", param)


def _check_count(keyword: str, value, max_repeat: int, param: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{keyword}' in the JSON schema must be a number", param)
    if value < 0:
        raise invalid(f"'{keyword}' in the JSON schema must not be negative", param)
    if value > max_repeat:
        _too_big(f"'{keyword}' is {value}", max_repeat, "grammar_max_repeat", param)


def _check_node(node: dict, limit: _limits.InferenceLimits, param: str) -> None:
    ref = node.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
        # The converter would fetch remote references, guarded only by an assert.
        raise invalid("only local '$ref' references ('#/...') are allowed in the JSON schema", param)
    for keyword in REPEAT_KEYWORDS:
        if keyword in node:
            _check_count(keyword, node[keyword], limit.grammar_max_repeat, param)
    enum = node.get("enum")
    if isinstance(enum, list) and len(enum) > limit.grammar_max_enum:
        _too_big(f"an enum has {len(enum)} values", limit.grammar_max_enum, "grammar_max_enum", param)
    for low, high in MIN_MAX_KEYWORDS:
        if isinstance(node.get(low), (int, float)) and isinstance(node.get(high), (int, float)) \
                and node[high] < node[low]:
            raise invalid(f"the JSON schema in '{param}' can match nothing: '{low}' is "
                          f"{node[low]} and '{high}' is {node[high]}", param)
    if _no_number_between(node):
        raise invalid(f"the JSON schema in '{param}' can match nothing: no "
                      f"{'integer' if node.get('type') == 'integer' else 'number'} lies within "
                      f"its minimum and maximum", param)
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        for low, high in QUANTIFIER.findall(pattern):
            for value in (low, high):
                if value and int(value) > limit.grammar_max_repeat:
                    _too_big(f"a pattern repeats {value} times", limit.grammar_max_repeat,
                             "grammar_max_repeat", param)
            if high and int(high) < int(low):
                raise invalid(f"the pattern {pattern[:100]!r} in '{param}' repeats an item at "
                              f"least {low} and at most {high} times", param)
        backwards = reversed_range(pattern)
        if backwards is not None:
            raise invalid(f"the pattern {pattern[:100]!r} in '{param}' can match nothing: its "
                          f"character range {backwards} ends before it begins", param)
        nested = nested_repeat(pattern)
        if nested > MAX_NESTED_REPEAT:
            raise invalid(f"the JSON schema in '{param}' is too large: a pattern nests "
                          f"repetitions {nested} times over (the limit for repetitions inside "
                          f"repetitions is {MAX_NESTED_REPEAT}, fixed)", param)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _no_number_between(node: dict) -> bool:
    """A numeric range with nothing in it. The converter writes an integer's as a reversed
    character class ([4-3]), which the model's first token cannot get past."""
    below = [(node[k], k == "exclusiveMaximum") for k in ("maximum", "exclusiveMaximum") if _number(node.get(k))]
    above = [(node[k], k == "exclusiveMinimum") for k in ("minimum", "exclusiveMinimum") if _number(node.get(k))]
    if not below or not above:
        return False
    if node.get("type") == "integer":
        lowest = max(math.floor(v) + 1 if exclusive else math.ceil(v) for v, exclusive in above)
        highest = min(math.ceil(v) - 1 if exclusive else math.floor(v) for v, exclusive in below)
        return lowest > highest
    low, low_exclusive = max(above, key=lambda bound: (bound[0], bound[1]))
    high, high_exclusive = min(below, key=lambda bound: (bound[0], not bound[1]))
    return low > high or (low == high and (low_exclusive or high_exclusive))


def check_schema(schema: dict, limit: _limits.InferenceLimits, param: str = PARAM) -> None:
    """Walk the schema without recursion: depth, node count, and each node's keywords."""
    stack = [(schema, 1)]
    n_nodes = 0
    while stack:
        node, depth = stack.pop()
        n_nodes += 1
        if n_nodes > limit.schema_max_nodes:
            _too_big(f"more than {limit.schema_max_nodes} objects and arrays",
                     limit.schema_max_nodes, "schema_max_nodes", param)
        if depth > limit.schema_max_depth:
            _too_big(f"nested deeper than {limit.schema_max_depth} levels", limit.schema_max_depth,
                     "schema_max_depth", param)
        if isinstance(node, dict):
            _check_node(node, limit, param)
            children = node.values()
        else:
            children = node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def _structure(gbnf: str) -> str:
    """The grammar with its string literals and character classes blanked out: what is left
    are rule names, groups and operators."""
    out = []
    quote = None
    escaped = False
    for ch in gbnf:
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            out.append(" ")
            continue
        if ch == '"':
            quote = '"'
        elif ch == "[":
            quote = "]"
        out.append(" " if quote else ch)
    return "".join(out)


def nesting(gbnf: str) -> int:
    """The deepest group nesting of a grammar, outside string literals and character classes."""
    deepest = depth = 0
    for ch in _structure(gbnf):
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


# A bounded repetition's {m,n} in the grammar's structure.
BOUNDS = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")


def reversed_bounds(gbnf: str) -> tuple[int, int] | None:
    """The first `{m,n}` with n < m. llama.cpp's grammar parser takes n - m unsigned: it
    would write rules until the process runs out of memory."""
    for match in BOUNDS.finditer(_structure(gbnf)):
        low, high = int(match.group(1)), int(match.group(2))
        if high < low:
            return low, high
    return None


# A repetition in the grammar's text: `atom{m}`, `atom{m,}` or `atom{m,n}`.
REPETITION = re.compile(r"(\S+?)\{(\d+)(?:,(\d*))?\}")
# What one copy of a repeated atom costs at least once llama.cpp has expanded it into rules.
MIN_COPY_BYTES = 8


def expanded_bytes(gbnf: str) -> int:
    """The grammar's size with its repetitions written out. llama.cpp's converter writes
    `char{0,900}` where the Python port wrote 900 nested groups, and llama.cpp's grammar parser
    expands it into as many rules: the text alone no longer shows what the grammar costs."""
    extra = 0
    for match in REPETITION.finditer(gbnf):
        lo, hi = int(match.group(2)), match.group(3)
        copies = int(hi) if hi else lo
        extra += copies * max(len(match.group(1)), MIN_COPY_BYTES)
    return len(gbnf) + extra


def check_grammar(gbnf: str, limit: _limits.InferenceLimits, param: str = PARAM) -> None:
    bounds = reversed_bounds(gbnf)
    if bounds is not None:
        raise invalid(f"the JSON schema in '{param}' can match nothing: it asks for at least "
                      f"{bounds[0]} and at most {bounds[1]} repetitions of an item", param)
    size = expanded_bytes(gbnf)
    if size > limit.grammar_max_bytes:
        _too_big(f"its grammar is {size} bytes with its repetitions written out",
                 limit.grammar_max_bytes, "grammar_max_bytes", param)
    n_rules = gbnf.count("::=")
    if n_rules > limit.grammar_max_rules:
        _too_big(f"its grammar has {n_rules} rules", limit.grammar_max_rules, "grammar_max_rules", param)
    if nesting(gbnf) > MAX_GRAMMAR_NESTING:
        _too_big(f"its grammar nests deeper than {MAX_GRAMMAR_NESTING} groups", MAX_GRAMMAR_NESTING,
                 "grammar_max_repeat", param)


def json_schema_grammar(schema: dict, limit: _limits.InferenceLimits | None = None,
                        param: str = PARAM) -> str:
    """`param`: the request field the schema came from, named by every refusal."""
    limit = limit or _limits.current
    check_schema(schema, limit, param)
    try:
        gbnf = json_schema_to_gbnf(orjson.dumps(schema).decode())
    except Exception as exc:      # the converter raises several kinds on schemas it cannot express
        raise invalid(f"unsupported JSON schema: {str(exc)[:300]}", param) from None
    check_grammar(gbnf, limit, param)
    return gbnf
