"""Field checks for JSON bodies. Each failure is a 400 that names the field.

A field is described once, by a spec (`Integer`, `Number`, `String`, `Boolean`, `Object`,
`Array`, `Tokens`, `OneOf`, `Const`), and that one description does both jobs:
`spec.read(body)` checks the field and returns its value (or its default), and `spec.schema()`
is its JSON Schema for the OpenAPI document (server/http/openapi.py). `Fields` reads a list
of specs from one body in one pass; `Body` is what an endpoint declares it takes.

Specs are built once, at import. Reading costs about what the hand-written checks did: the
path of a nested field ("messages[2].content") is only spelled out when it goes into an error.

The functions at the end (`string`, `integer`, ...) are the same checks for one-off use.
"""
from __future__ import annotations

from .errors import ApiError, invalid

_MISSING = object()


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
               dict: "object", type(None): "null"}


_PY_TYPES = {"boolean": (bool,), "integer": (int,), "number": (int, float), "string": (str,),
             "array": (list,), "object": (dict,), "null": (type(None),), "": ()}


def _type_name(value) -> str:
    return _JSON_TYPES.get(type(value)) or type(value).__name__


def path_text(path) -> str:
    """A path is a field name, or (parent path, key) with key a name or an array index."""
    if type(path) is not tuple:
        return path
    parent, key = path
    head = path_text(parent) if parent else ""
    if type(key) is int:
        return f"{head}[{key}]"
    return f"{head}.{key}" if head else key


def _invalid(path, text: str) -> ApiError:
    where = path_text(path)
    return invalid(f"'{where}' {text}", where)


class Spec:
    """One field: its name in the enclosing object, whether it must be there, its default.

    `null` counts as absent for optional fields (OpenAI's SDKs send it), so their schema
    allows null. `check(value, path)` takes a present, non-null value.
    """

    __slots__ = ("name", "required", "default", "doc")
    json_type = ""
    article = "a"

    def __init__(self, name: str = "", *, required: bool = False, default=None, doc: str = ""):
        self.name = name
        self.required = required
        self.default = default
        self.doc = doc

    def read(self, body: dict, parent=None):
        value = body.get(self.name)
        path = self.name if parent is None else (parent, self.name)
        if value is None:
            return self.absent(path, self.name in body)
        return self.check(value, path)

    def absent(self, path, sent_null: bool):
        if self.required:
            raise _invalid(path, "is required")
        return self.default

    def check(self, value, path):
        raise NotImplementedError

    def wrong_type(self, value, path) -> ApiError:
        return _invalid(path, f"must be {self.article} {self.json_type}, not {_type_name(value)}")

    # ---- JSON Schema ----------------------------------------------------------------------

    def schema(self) -> dict:
        out = self._schema()
        if self.doc:
            out["description"] = self.doc
        if self.default is not None:
            out["default"] = self.default
        return out

    def _schema(self) -> dict:
        return {"type": self.json_type}

    def schema_in_object(self) -> dict:
        """As a property: optional fields also take null (the same as leaving them out)."""
        out = self.schema()
        if self.required:
            return out
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
            return out
        return {"anyOf": [out, {"type": "null"}]}


class Integer(Spec):
    __slots__ = ("lo", "hi")
    json_type = "integer"
    article = "an"

    def __init__(self, name: str = "", *, lo: int | None = None, hi: int | None = None, **kw):
        super().__init__(name, **kw)
        self.lo = lo
        self.hi = hi

    def check(self, value, path):
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.wrong_type(value, path)
        lo, hi = self.lo, self.hi
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise _out_of_range(path, lo, hi, value)
        return value

    def _schema(self) -> dict:
        return _bounded({"type": "integer"}, self.lo, self.hi)


class Number(Spec):
    __slots__ = ("lo", "hi")
    json_type = "number"

    def __init__(self, name: str = "", *, lo: float, hi: float, **kw):
        super().__init__(name, **kw)
        self.lo = lo
        self.hi = hi

    def check(self, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.wrong_type(value, path)
        if not self.lo <= value <= self.hi:     # also false for NaN
            raise _out_of_range(path, self.lo, self.hi, value)
        return float(value)

    def _schema(self) -> dict:
        return _bounded({"type": "number"}, self.lo, self.hi)


def _out_of_range(path, lo, hi, value) -> ApiError:
    if hi is None:
        return _invalid(path, f"must be at least {lo}, got {value}")
    if lo is None:
        return _invalid(path, f"must be at most {hi}, got {value}")
    return _invalid(path, f"must be between {lo} and {hi}, got {value}")


def _bounded(out: dict, lo, hi) -> dict:
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


class String(Spec):
    """`max_len=None`: unbounded (the body cap bounds it). `choices`: the allowed values."""

    __slots__ = ("max_len", "allow_empty", "choices")
    json_type = "string"

    def __init__(self, name: str = "", *, max_len: int | None = 4096, allow_empty: bool = False,
                 choices: tuple[str, ...] | None = None, **kw):
        super().__init__(name, **kw)
        self.max_len = max_len
        self.allow_empty = allow_empty
        self.choices = choices

    def absent(self, path, sent_null: bool):
        if sent_null and self.required:          # "must be a string, not null", as it always was
            raise self.wrong_type(None, path)
        return Spec.absent(self, path, sent_null)

    def check(self, value, path):
        if type(value) is not str:
            raise self.wrong_type(value, path)
        if self.choices is not None:
            if value not in self.choices:
                raise _invalid(path, f"must be {_either(self.choices)}")
            return value
        if not value and not self.allow_empty:
            raise _invalid(path, "must not be empty")
        if self.max_len is not None and len(value) > self.max_len:
            raise _invalid(path, f"is longer than {self.max_len} characters")
        return value

    def _schema(self) -> dict:
        if self.choices is not None:
            return {"type": "string", "enum": list(self.choices)}
        out = {"type": "string"}
        if not self.allow_empty:
            out["minLength"] = 1
        if self.max_len is not None:
            out["maxLength"] = self.max_len
        return out


def _either(choices) -> str:
    quoted = [f"'{c}'" for c in choices]
    last = quoted.pop()
    return f"{', '.join(quoted)} or {last}" if quoted else last


class Boolean(Spec):
    __slots__ = ()
    json_type = "boolean"

    def __init__(self, name: str = "", *, default: bool = False, **kw):
        super().__init__(name, default=default, **kw)

    def check(self, value, path):
        if value is True or value is False:
            return value
        raise self.wrong_type(value, path)

    def schema(self) -> dict:
        out = {"type": "boolean", "default": self.default}
        if self.doc:
            out["description"] = self.doc
        return out


class Const(Spec):
    """Exactly one value (a discriminator such as a content part's "type")."""

    __slots__ = ("value",)

    def __init__(self, name: str = "", value=None, **kw):
        super().__init__(name, **kw)
        self.value = value

    def check(self, value, path):
        if value != self.value or type(value) is not type(self.value):
            raise _invalid(path, f"must be {self.value!r}")
        return value

    def _schema(self) -> dict:
        return {"const": self.value}


class Fields:
    """A list of specs read from one object in one pass over the keys it holds: a body of
    five fields costs five checks however many fields are known. The list is read by
    reference, so a spec appended to it later is read (and described) too."""

    __slots__ = ("specs", "_n", "_index", "_defaults", "_required")

    def __init__(self, specs: list):
        self.specs = specs
        self._n = -1

    def _build(self) -> None:
        self._index = {spec.name: spec for spec in self.specs}
        self._defaults = {spec.name: spec.default for spec in self.specs}
        self._required = [spec for spec in self.specs if spec.required]
        self._n = len(self.specs)

    def read(self, body: dict, parent=None) -> dict:
        """{name: value} for every spec: each present field checked, defaults filled in."""
        if len(self.specs) != self._n:
            self._build()
        out = self._defaults.copy()
        index = self._index
        for key, value in body.items():
            spec = index.get(key)
            if spec is not None:
                path = key if parent is None else (parent, key)
                out[key] = spec.absent(path, True) if value is None else spec.check(value, path)
        for spec in self._required:
            if spec.name not in body:
                spec.absent(spec.name if parent is None else (parent, spec.name), False)
        return out

    def check(self, body: dict, parent) -> None:
        """read() without the answer: for nested objects that are used as sent."""
        if len(self.specs) != self._n:
            self._build()
        index = self._index
        for key, value in body.items():
            spec = index.get(key)
            if spec is not None:
                if value is None:
                    spec.absent((parent, key), True)
                else:
                    spec.check(value, (parent, key))
        for spec in self._required:
            if spec.name not in body:
                spec.absent((parent, spec.name), False)

    def schema(self, *, closed: bool = False) -> dict:
        out: dict = {"type": "object",
                     "properties": {f.name: f.schema_in_object() for f in self.specs}}
        required = [f.name for f in self.specs if f.required]
        if required:
            out["required"] = required
        if closed:
            out["additionalProperties"] = False
        return out


def _flat_check(plain: Spec, value, path):
    try:
        return plain.check(value, path)
    except ApiError as exc:
        raise ApiError(exc.kind, exc.message, param=path_text(path), headers=exc.headers) from None


class Object(Spec):
    """A JSON object whose `fields` are checked. Other keys are let through (OpenAI's SDKs
    send fields a server may not know). `message` replaces any complaint about the object
    or its fields by one sentence, where `{field}` is the object's path. `flat`: errors
    inside still say where, but their `param` is this field (OpenAI's top-level name)."""

    __slots__ = ("fields", "message", "flat")
    json_type = "object"
    article = "an"

    def __init__(self, name: str = "", *fields: Spec, message: str | None = None,
                 flat: bool = False, **kw):
        super().__init__(name, **kw)
        self.fields = Fields(list(fields))
        self.message = message
        # flat: the same spec, not flat, whose errors check() renames (None: not flat)
        self.flat = Object(name, *fields, message=message, **kw) if flat else None

    def check(self, value, path):
        if self.flat is not None:
            return _flat_check(self.flat, value, path)
        if type(value) is not dict:
            raise self._complaint(path) or self.wrong_type(value, path)
        if self.fields.specs:
            if self.message is None:
                self.fields.check(value, path)
            else:
                try:
                    self.fields.check(value, path)
                except ApiError:
                    raise self._complaint(path) from None
        return value

    def _complaint(self, path) -> ApiError | None:
        if self.message is None:
            return None
        where = path_text(path)
        return invalid(self.message.format(field=where), where)

    def _schema(self) -> dict:
        return self.fields.schema()


class Array(Spec):
    __slots__ = ("items", "min_items", "max_items")
    json_type = "array"
    article = "an"

    def __init__(self, name: str = "", items: Spec | None = None, *, min_items: int = 0,
                 max_items: int | None = None, **kw):
        super().__init__(name, **kw)
        self.items = items
        self.min_items = min_items
        self.max_items = max_items

    def check(self, value, path):
        self.check_size(value, path)
        items = self.items
        if items is not None:
            for i, item in enumerate(value):
                items.check(item, (path, i))
        return value

    def check_size(self, value, path) -> None:
        """The array itself, not its items (for a caller that checks them as it goes)."""
        if type(value) is not list:
            raise self.wrong_type(value, path)
        if len(value) < self.min_items:
            if self.min_items == 1:
                raise _invalid(path, "must not be empty")
            raise _invalid(path, f"must hold at least {self.min_items} items")
        if self.max_items is not None and len(value) > self.max_items:
            raise _invalid(path, f"may hold at most {self.max_items} items")

    def _schema(self) -> dict:
        out: dict = {"type": "array"}
        if self.items is not None:
            out["items"] = self.items.schema()
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


class Tokens(Spec):
    """A non-empty array of token ids (integers from 0). The upper bound is the model's
    vocabulary, known per request: the caller checks it."""

    __slots__ = ()
    json_type = "array"
    article = "an"

    def check(self, value, path):
        if not is_tokens(value):
            raise _invalid(path, "must be a non-empty array of token ids")
        return value

    def _schema(self) -> dict:
        return {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


def is_tokens(value) -> bool:
    return (type(value) is list and bool(value)
            and all(type(t) is int and t >= 0 for t in value))


class OneOf(Spec):
    """The first of `choices` that takes the value wins. When none does, the complaint of the
    choice of the value's own JSON type is the one shown (an array of bad parts is told what
    is wrong with the part; of several, the last), else `message` (`{field}`: the path).
    `flat` as for Object."""

    __slots__ = ("choices", "message", "flat", "_by_type")

    def __init__(self, name: str = "", *choices: Spec, message: str | None = None,
                 flat: bool = False, **kw):
        super().__init__(name, **kw)
        self.choices = choices
        self.message = message
        self.flat = OneOf(name, *choices, message=message, **kw) if flat else None
        self._by_type: dict[type, list[Spec]] = {}
        for choice in choices:
            for py_type in _PY_TYPES[choice.json_type]:
                self._by_type.setdefault(py_type, []).append(choice)

    def check(self, value, path):
        if self.flat is not None:
            return _flat_check(self.flat, value, path)
        # Only the choices of the value's JSON type can take it: no exceptions on the way
        # to the usual answer.
        candidates = self._by_type.get(type(value))
        if candidates is None:
            where = path_text(path)
            if self.message is not None:
                raise invalid(self.message.format(field=where), where)
            kinds = " or ".join(f"{c.article} {c.json_type}" for c in self.choices)
            raise invalid(f"'{where}' must be {kinds}, not {_type_name(value)}", where)
        if len(candidates) == 1:
            return candidates[0].check(value, path)
        error = None
        for choice in candidates:          # the last one's complaint: list the widest last
            try:
                return choice.check(value, path)
            except ApiError as exc:
                error = exc
        raise error

    def _schema(self) -> dict:
        return {"anyOf": [choice.schema() for choice in self.choices]}


class Body:
    """What an endpoint takes: a JSON object with these fields. `parts` are specs, or lists
    of specs held by reference (a handler's own list: what it reads is what is described)."""

    __slots__ = ("parts", "doc", "example")

    def __init__(self, *parts, doc: str = "", example: dict | None = None):
        self.parts = parts
        self.doc = doc
        self.example = example

    def specs(self) -> list[Spec]:
        out = []
        for part in self.parts:
            out.extend(part if isinstance(part, list) else (part,))
        return out

    def schema(self) -> dict:
        out = Fields(self.specs()).schema()
        if self.doc:
            out["description"] = self.doc
        return out


# ---- one-off checks ---------------------------------------------------------------------------

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
    return _optional(body, field, default, bool, "a boolean")


def obj(body: dict, field: str, *, default=None):
    return _optional(body, field, default, dict, "an object")


def _optional(body: dict, field: str, default, kind: type, what: str):
    """The field if it is a `kind`; `default` when it is absent or null."""
    value = body.get(field, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, kind):
        raise invalid(f"'{field}' must be {what}, not {_type_name(value)}", field)
    return value
