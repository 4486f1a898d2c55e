"""The hot path is compiled in production and its twin is what runs under STACKD_PURE_PYTHON=1."""
import importlib

from stackd import compiled


def test_the_modules_are_the_ones_this_run_asked_for():
    for name in compiled.COMPILED_MODULES:
        module_file = importlib.import_module(compiled.qualified(name)).__file__
        if compiled.pure_requested():
            assert module_file.endswith(".py"), name
        else:
            assert module_file.endswith(".so"), f"{name} is not compiled: {module_file}"
