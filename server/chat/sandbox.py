"""A Jinja sandbox that bounds what a chat template may cost: time, operations and memory.

Chat templates come from model files, and they run once per chat request on data the client
chose. jinja2's ImmutableSandboxedEnvironment keeps them away from Python internals but puts no
bound on work: a loop of 10^8 iterations, `'x' * 300000000`, `'x' | center(10**9)` or a doubling
`~` concatenation all run to completion. A Python thread cannot be stopped or memory-capped from
outside, so the bounds are cooperative, enforced inside the sandbox itself:

* every loop item, call, attribute or item lookup, operator, filter and concatenation is charged
  against an operation budget, and the clock is checked every few hundred charges;
* anything that builds a string or a list is checked *before* it is built (repetition, joins,
  replacements, padding widths, format widths) and its result after;
* `range` is capped, and the output is streamed against a size cap.

Every for-loop's iterable passes through a charging iterator (an AST rewrite at compile time), so
no loop can spin without paying. A failure of any kind is a TemplateFailure; the caller turns it
into a 400 that says the model's chat template failed.
"""
from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.runtime
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from .limits import InferenceLimits

CLOCK_EVERY = 256                       # charges between two looks at the clock
_NUMBER = re.compile(r"\d+")
_ITER = "stackd_budget_iter"
_CONCAT = "stackd_budget_concat"


class TemplateFailure(Exception):
    """The template could not render these messages (its own error, or a limit)."""


class _Budget:
    __slots__ = ("limits", "ops_left", "deadline", "until_clock")

    def __init__(self, limits: InferenceLimits):
        self.limits = limits
        self.ops_left = limits.template_max_ops
        self.deadline = time.monotonic() + limits.template_timeout
        self.until_clock = CLOCK_EVERY


_current = threading.local()


def _budget() -> _Budget:
    budget = getattr(_current, "budget", None)
    if budget is None:
        raise TemplateFailure("a template ran outside a rendering")
    return budget


def charge(n: int = 1) -> None:
    budget = _budget()
    budget.ops_left -= n
    if budget.ops_left < 0:
        raise TemplateFailure(f"it took more than {budget.limits.template_max_ops} operations "
                              "(inference.limits.template_max_ops)")
    budget.until_clock -= n
    if budget.until_clock <= 0:
        budget.until_clock = CLOCK_EVERY
        # A render is pure Python holding the GIL; the event loop waits for it. Hand it over
        # here (a microsecond), so the loop never waits for a whole switch interval or more.
        time.sleep(0)
        if time.monotonic() > budget.deadline:
            raise TemplateFailure(f"it ran longer than {budget.limits.template_timeout:g} s "
                                  "(inference.limits.template_timeout)")


def _size(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


def check_size(n: int, what: str = "a value") -> None:
    limits = _budget().limits
    if n > limits.template_max_bytes:
        raise TemplateFailure(f"{what} would be larger than {limits.template_max_bytes} bytes "
                              "(inference.limits.template_max_bytes)")


def check_items(n: int, what: str = "a list") -> None:
    limits = _budget().limits
    if n > limits.template_max_items:
        raise TemplateFailure(f"{what} would have more than {limits.template_max_items} items "
                              "(inference.limits.template_max_items)")


def checked(value):
    """A result that may have grown: strings against the byte cap, containers against items."""
    if isinstance(value, str):
        check_size(len(value))
    elif isinstance(value, (list, tuple, dict)):
        check_items(len(value))
    return value


def _check_numbers(args, kwargs) -> None:
    """No call may take an integer larger than the byte cap: widths, counts and the like."""
    cap = _budget().limits.template_max_bytes
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > cap:
            raise TemplateFailure(f"a call was given {value}, more than {cap} "
                                  "(inference.limits.template_max_bytes)")


def _check_format(fmt) -> None:
    """Widths and precisions inside a format string ('%999999999d', '{:999999999}')."""
    if isinstance(fmt, str):
        cap = _budget().limits.template_max_bytes
        if any(len(n) > 12 or int(n) > cap for n in _NUMBER.findall(fmt)):
            raise TemplateFailure(f"a format string asks for a width over {cap} "
                                  "(inference.limits.template_max_bytes)")


def _joined_size(items, separator) -> int:
    items = list(items)
    check_items(len(items))
    return sum(len(x) if isinstance(x, str) else len(str(x)) for x in items) + \
        len(str(separator)) * max(len(items) - 1, 0)


def _replaced_size(text, old, new, count=-1) -> int:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    n = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(text) + n * (len(new) - len(old))


def _precheck_str_method(method, args, kwargs) -> None:
    method = getattr(method, "__wrapped__", method)     # the sandbox wraps str.format
    name = getattr(method, "__name__", "")
    text = getattr(method, "__self__", None)
    if not isinstance(text, str):
        return
    if name == "join" and args:
        check_size(_joined_size(args[0], text), "a joined string")
    elif name == "replace" and len(args) >= 2:
        check_size(_replaced_size(text, *args[:3]), "a replaced string")
    elif name in ("format", "format_map"):
        _check_format(text)


class _ChargeLoops(NodeTransformer):
    """Every for-loop iterates through the budget; every `~` concatenation is measured."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.Name(_ITER, "load"), [node.iter], [], None, None)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.Name(_CONCAT, "load"), [nodes.List(node.nodes)], [], None, None)


def _budget_iter(iterable):
    for item in iterable:
        charge()
        yield item


def _budget_concat(parts) -> str:
    texts = [p if isinstance(p, str) else str(p) for p in parts]
    check_size(sum(len(t) for t in texts), "a concatenated string")
    charge(len(texts))
    return "".join(texts)


def _safe_range(*args) -> range:
    result = range(*args)
    check_items(len(result), "range()")
    return result


def _bounded_filter(name: str, function):
    def bounded(*args, **kwargs):
        charge()
        _check_numbers(args, kwargs)
        values = [a for a in args if not isinstance(a, (jinja2.runtime.Context,
                                                         jinja2.nodes.EvalContext,
                                                         jinja2.Environment))]
        if name == "join" and values:
            check_size(_joined_size(values[0], values[1] if len(values) > 1 else kwargs.get("d", "")),
                       "a joined string")
        elif name == "replace" and len(values) >= 3:
            check_size(_replaced_size(str(values[0]), *values[1:4]), "a replaced string")
        elif name == "format" and values:
            _check_format(values[0])
        return checked(function(*args, **kwargs))

    # keeps jinja's pass_context & co. markers
    bounded.__dict__.update(getattr(function, "__dict__", {}))
    bounded.__name__ = getattr(function, "__name__", name)
    return bounded


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """As Transformers renders chat-template JSON."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+", "%", "//", "/"])
    intercepted_unops = frozenset(["-", "+"])

    def __init__(self):
        super().__init__(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                         extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols])
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.globals.update({"range": _safe_range, _ITER: _budget_iter, _CONCAT: _budget_concat})

    def _parse(self, source, name, filename):
        return _ChargeLoops().visit(super()._parse(source, name, filename))

    def call_binop(self, context, operator, left, right):
        charge()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                    (check_size if isinstance(seq, str) else check_items)(_size(seq) * max(times, 0))
        elif operator == "+" and isinstance(left, (str, list, tuple)):
            (check_size if isinstance(left, str) else check_items)(_size(left) + _size(right))
        elif operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise TemplateFailure("a power larger than 64 was asked for")
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        return checked(super().call_binop(context, operator, left, right))

    def call_unop(self, context, operator, arg):
        charge()
        return super().call_unop(context, operator, arg)

    def getattr(self, obj, attribute):
        charge()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        charge()
        return super().getitem(obj, argument)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        charge()
        _check_numbers(args, kwargs)
        _precheck_str_method(__obj, args, kwargs)
        return checked(super().call(__context, __obj, *args, **kwargs))

    def format_string(self, s, args, kwargs, format_func=None):
        charge()
        _check_format(s)
        return checked(super().format_string(s, args, kwargs, format_func))


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """HuggingFace's `{% generation %}` tag passes its body through."""

    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message) -> None:
    raise TemplateFailure(f"it raised: {str(message)[:300]}")


def _strftime_now(fmt) -> str:
    _check_format(fmt)
    return datetime.now().strftime(str(fmt))


class ChatTemplate:
    """One model's chat template, compiled once; rendering is bounded by `limits`."""

    def __init__(self, source: str, bos_token: str, eos_token: str):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            environment = BoundedEnvironment()
            self.template = environment.from_string(source)
            # the variables it reads: a template that never reads `tools` cannot show them
            self.variables = frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source)))
            self.error = None
        except Exception as exc:          # kept: every chat request will say why it fails
            self.template = None
            self.variables = frozenset()
            self.error = f"it does not compile: {str(exc)[:300]}"

    def render(self, messages: list[dict], limits: InferenceLimits, extra: dict | None = None) -> str:
        """`extra`: more variables for the template (`tools`, `enable_thinking`, ...)."""
        if self.template is None:
            raise TemplateFailure(self.error)
        _current.budget = _Budget(limits)
        try:
            return self._render(messages, limits.template_max_bytes, extra)
        except TemplateFailure:
            raise
        except RecursionError:
            raise TemplateFailure("it recursed too deeply") from None
        except MemoryError:
            raise TemplateFailure("it ran out of memory") from None
        except Exception as exc:
            raise TemplateFailure(f"{type(exc).__name__}: {str(exc)[:300]}") from None
        finally:
            _current.budget = None

    def _render(self, messages: list[dict], max_bytes: int, extra: dict | None) -> str:
        out, size = [], 0
        variables = dict(
            messages=messages, bos_token=self.bos_token, eos_token=self.eos_token,
            add_generation_prompt=True, raise_exception=_raise_exception,
            strftime_now=_strftime_now, tools=None, functions=None, tool_choice=None,
            function_call=None)
        if extra:
            variables.update(extra)
        for piece in self.template.generate(**variables):
            size += len(piece)
            if size > max_bytes:
                raise TemplateFailure(f"its output is larger than {max_bytes} bytes "
                                      "(inference.limits.template_max_bytes)")
            out.append(piece)
            charge()
        return "".join(out)
