"""The prompt cache across a daemon's restart, against the real daemon and the default chat
model: a conversation's first turn over a long system prompt is saved in the data dir; a new
daemon on that data dir answers the next turn with the first turn's tokens restored
(usage.prompt_tokens_details.cached_tokens, and /metrics' prompt-cache counters): put back into a
slot at load by default (models.prompt_cache_preload), read at admission without it; the same
answer a daemon without the cache gives; `stackd models rm` removes the model's files."""
import glob
import os
import time

import pytest

from testing.daemon import CLIENT_TIMEOUT, Daemon, cli

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
CONFIG = ("[rate_limits]\ninference = 0\n[engine]\nslots = 2\ncontext_length = 2048\n"
          "[models]\npreload = [\"smollm2-135m-instruct\"]\nprompt_cache_min_tokens = 256\n")
SYSTEM = "You control a home. These are the devices and their states.\n" + "\n".join(
    f"Device {i}: the {['kitchen', 'hall', 'garage'][i % 3]} light {i}, state {'on' if i % 2 else 'off'}."
    for i in range(60))


def chat(daemon, messages) -> dict:
    status, _, answer = daemon.request("POST", "/v1/chat/completions", port="inference", key=daemon.admin_key,
                                       body={"model": CHAT, "messages": messages, "temperature": 0,
                                             "max_tokens": 16})
    assert status == 200, answer
    return answer


def metric(daemon, name: str) -> float:
    status, _, text = daemon.request("GET", "/metrics", key=daemon.admin_key)
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def kv_files(data_dir) -> list[str]:
    return glob.glob(os.path.join(data_dir, "models", "kv", "*", "*.kv"))


def wait_for(predicate, what: str):
    deadline = time.monotonic() + CLIENT_TIMEOUT    # a hang guard, not a measure
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.parametrize("preload", [None, 0], ids=["preloaded", "at_admission"])
def test_a_restarted_daemon_restores_the_conversation_prefix(tmp_path, preload):
    data = str(tmp_path / "data")
    first_turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which lights are on?"}]
    one = Daemon(data, CONFIG, models=True)
    try:
        first = chat(one, first_turn)
        assert first["usage"]["prompt_tokens"] > 256
        wait_for(lambda: kv_files(data), "the first turn's file")
        assert metric(one, "stackd_prompt_cache_saves_total") == 1
    finally:
        one.stop()
    second_turn = first_turn + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                                {"role": "user", "content": "And which are off?"}]

    config = CONFIG if preload is None else CONFIG + f"prompt_cache_preload = {preload}\n"
    two = Daemon(data, config, models=True)
    try:
        restored = chat(two, second_turn)
        cached = restored["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first["usage"]["prompt_tokens"] - 1     # the whole first turn from disk
        # the default puts the file back at load (the turn reuses it in memory); 0 reads it now
        assert metric(two, "stackd_prompt_cache_preloads_total") == (1 if preload is None else 0)
        assert metric(two, "stackd_prompt_cache_hits_total") == (0 if preload is None else 1)
        assert metric(two, "stackd_prompt_cache_read_bytes_total") > 0
    finally:
        two.stop()

    cold = Daemon(str(tmp_path / "cold"), CONFIG.replace("prompt_cache_min_tokens = 256",
                                                         "prompt_cache_mb = 0"), models=True)
    try:
        answer = chat(cold, second_turn)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(cold, "stackd_prompt_cache_saves_total") == 0
    finally:
        cold.stop()
    assert restored["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]

    done = cli("models", "rm", CHAT, data_dir=data)            # the model goes, its files too
    assert done.returncode == 0, done.stderr
    assert kv_files(data) == []
