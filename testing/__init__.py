"""The test support: harnesses, simulated peers, fault injection's entry point, test models.

Outside the product: the folder sits at the checkout's root, the wheel does not ship it, and no
module of `stackd` imports it (tests/test_layering.py). The tests import it as `testing`
(pyproject.toml's pytest `pythonpath`), bench/ scripts after putting the root on sys.path, and a
daemon with injected faults runs as `python -m testing.serve` (testing/serve.py).
"""
