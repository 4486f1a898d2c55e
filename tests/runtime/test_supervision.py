"""The worker restart schedule: at once after a first crash, then a doubling back-off, capped."""
from stackd.engine.config import EngineConfig
from stackd.runtime.supervisor import RESTART_BACKOFF_MAX, restart_delay


def test_a_first_crash_restarts_at_once():
    assert restart_delay(1) == 0.0


def test_a_crash_loop_backs_off_doubling():
    assert [restart_delay(n) for n in (2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0]


def test_the_back_off_is_capped():
    assert restart_delay(50) == RESTART_BACKOFF_MAX


def test_auto_wait_policy_spins_for_chat_and_sleeps_for_embeddings():
    def policy(setting, embeddings):
        return EngineConfig(omp_wait_policy=setting).omp_wait_policy_for(embeddings)
    assert policy("auto", embeddings=False) == "inherit"
    assert policy("auto", embeddings=True) == "passive"
    assert policy("active", embeddings=True) == "active"
    assert policy("passive", embeddings=False) == "passive"
