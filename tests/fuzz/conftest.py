import os

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from .budget import TOTAL_SECONDS

# hypothesis keeps caches on disk: under build/ (ignored by git), not in a new top-level folder
set_hypothesis_home_dir(os.path.join(os.path.dirname(__file__), "..", "..", "build", "hypothesis"))

# relative cost of each target (a share of the time budget), by test function name
WEIGHTS = {"test_llama_cpp_never_aborts_on_a_vocabulary_the_rules_accept": 2.0}


@pytest.hookimpl(trylast=True)         # after -k / -m deselection: shares of what runs
def pytest_collection_modifyitems(config, items):
    fuzz = [item for item in items if item.get_closest_marker("fuzz")]
    total = sum(WEIGHTS.get(item.originalname, 1.0) for item in fuzz) or 1.0
    for item in fuzz:
        item.fuzz_seconds = TOTAL_SECONDS * WEIGHTS.get(item.originalname, 1.0) / total


@pytest.fixture
def fuzz_seconds(request) -> float:
    """This target's share of the fuzzing time."""
    return request.node.fuzz_seconds
