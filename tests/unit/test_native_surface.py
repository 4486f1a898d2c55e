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
