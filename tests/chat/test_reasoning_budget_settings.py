"""inference.reasoning_budget.*: thinking tokens per reasoning_effort, -1 for no bound, from the
file or the environment; below -1 refused at start-up."""
import pytest

from stackd import config
from stackd.chat.limits import ReasoningBudget


def test_defaults_and_the_effort_map():
    budget = ReasoningBudget()
    assert [budget.of(e) for e in ("minimal", "low", "medium", "high")] == [64, 256, 1024, 4096]
    assert budget.of(None) == budget.medium           # no reasoning_effort: medium
    assert budget.of("none") == 0                     # forced closed should the model think


@pytest.mark.parametrize("value,ok", [("-1", True), ("0", True), ("-2", False)])
def test_the_setting_at_its_edge(tmp_path, value, ok):
    environ = {"STACKD_DATA_DIR": str(tmp_path), "STACKD_INFERENCE_REASONING_BUDGET_LOW": value}
    if ok:
        assert config.load(environ=environ)["inference.reasoning_budget.low"] == int(value)
    else:
        with pytest.raises(config.ConfigError, match="inference.reasoning_budget.low"):
            config.load(environ=environ)
