"""The native module's surface has one source: what it binds. The stub must say the same."""
import ast
import os

from stackd.engine import core as native

STUB = os.path.join(os.path.dirname(native.__file__), os.pardir, "_engine.pyi")


def stub_class_fields(name: str) -> set[str]:
    tree = ast.parse(open(STUB).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


def test_the_stub_lists_exactly_the_bound_sampling_fields():
    assert stub_class_fields("SamplingParams") == set(native.SAMPLING_FIELDS)


def test_every_sampling_field_survives_the_worker_wire():
    from stackd.runtime.clients import sampling_fields
    p = native.SamplingParams()
    p.temperature, p.seed, p.logit_bias, p.grammar = 0.5, 7, [(3, -1.5)], 'root ::= "a"'
    import orjson
    q = native.SamplingParams()
    for name, value in orjson.loads(orjson.dumps(sampling_fields(p))).items():
        setattr(q, name, value)
    assert sampling_fields(q) == sampling_fields(p)


def stub_members(name: str) -> set[str]:
    """The names a stub class declares, its stub-only bases' included."""
    tree = ast.parse(open(STUB).read())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    cls = classes[name]
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    names |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            names |= stub_members(base.id)
    return names


def test_what_the_stub_says_engine_and_vocab_have_they_have():
    for name in ("Engine", "Vocab"):
        bound = dir(getattr(native, name))
        assert stub_members(name) <= set(bound), (name, stub_members(name) - set(bound))
