"""The prompt cache on disk (native/engine/prompt_cache.h), on the real engine and the default
chat model: a prompt saved by one engine is restored by the next on the same directory (the
restart), with the tokens a cold prefill gives under greedy sampling; its key keeps another
model, KV type or context layout out; a truncated, bit-flipped or foreign file is a miss and is
removed; two requests restore one prefix at once; a prompt that parts from a saved one restores
what they share; a prompt is saved only when it adds min_tokens to what the files hold, and its
file replaces one it extends; the budget drops the least recently used; the shortest prompt
saved; a write that fails (a full disk) skips the save and the request goes on; a load puts the
most recently used files back into idle slots (preload), never another key's or a damaged one."""
import os
import subprocess
import sys
import textwrap

import pytest

from stackd.engine.core import STATUS_LENGTH, STATUS_STOPPED, Engine
from stackd.store import defaults

from .conftest import Driver

MIN_TOKENS = 256
MAX_TOKENS = 8
DONE = (STATUS_LENGTH, STATUS_STOPPED)


def system_text(n_devices: int, seed: int = 0) -> str:
    rooms = ["kitchen", "hall", "bedroom", "garage", "office", "garden"]
    lines = [f"Device {i + seed}: the {rooms[(i + seed) % len(rooms)]} light {i}, state "
             f"{'on' if (i * 7 + seed) % 3 else 'off'}, brightness {(i * 37 + seed) % 100} percent."
             for i in range(n_devices)]
    return "You control a home. These are the devices and their states.\n" + "\n".join(lines)


def turn(engine, system: str, user: str) -> list[int]:
    return engine.tokenize(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                           "<|im_start|>assistant\n", False, True)


def follow_up(engine, first: list[int], answer: str, user: str) -> list[int]:
    return first + engine.tokenize(f"{answer}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                                   "<|im_start|>assistant\n", False, True)


class Cache:
    """Engines on one prompt cache directory (a model's), as the runtime starts them."""

    def __init__(self, root, key="model=smollm2", budget=512 << 20, **engine):
        self.root = str(root)
        self.dir = os.path.join(self.root, "m")
        self.key = key
        self.budget = budget
        self.engine = dict(slots=2, context_length=1024, batch=256) | engine
        self.open = []

    def start(self, **overrides) -> Engine:
        kwargs = dict(self.engine, prompt_cache_dir=self.dir, prompt_cache_root=self.root,
                      prompt_cache_key=self.key, prompt_cache_min_tokens=MIN_TOKENS,
                      prompt_cache_bytes=self.budget) | overrides
        engine = Engine(defaults.smollm2_path(), **kwargs)
        self.open.append(engine)
        return engine

    def files(self) -> list[str]:
        if not os.path.isdir(self.dir):
            return []
        return sorted(os.path.join(self.dir, name) for name in os.listdir(self.dir))

    def close(self):
        for engine in self.open:
            engine.close()


@pytest.fixture
def cache(tmp_path):
    made = Cache(tmp_path / "kv")
    yield made
    made.close()


@pytest.fixture(scope="module")
def cold_engine():
    """For tokenizing; its answers are not cold once it has one (prefix reuse): cold() is."""
    engine = Engine(defaults.smollm2_path(), slots=2, context_length=1024, batch=256)
    yield engine
    engine.close()


COLD: dict[tuple, list[int]] = {}


def cold(prompt: list[int], max_tokens=MAX_TOKENS) -> list[int]:
    """The greedy answer of an engine that never saw anything: no cache, nothing in its slots."""
    key = (tuple(prompt), max_tokens)
    if key not in COLD:
        engine = Engine(defaults.smollm2_path(), slots=2, context_length=1024, batch=256)
        try:
            [(COLD[key], cached)] = run(engine, prompt, max_tokens=max_tokens)
            assert cached == 0
        finally:
            engine.close()
    return COLD[key]


def run(engine, *prompts, max_tokens=MAX_TOKENS) -> list[tuple[list[int], int]]:
    """Greedy answers to `prompts`, submitted together: (token ids, n_cached) each."""
    driver = Driver(engine)
    ids = [driver.submit(prompt, max_tokens, logprobs=True) for prompt in prompts]
    results = driver.wait(ids)
    out = []
    for rid in ids:
        result = results[rid]
        assert result["status"] in DONE, result
        tokens = [entry[0] for event in result["events"] for entry in (event.logprobs or [])]
        out.append((tokens, result["events"][0].n_cached))
    return out


@pytest.fixture(scope="module")
def prompts(cold_engine):
    """A first turn over a long system prompt, its follow-up, and the cold answer to the follow-up."""
    first = turn(cold_engine, system_text(24), "Which lights are on in the kitchen?")
    assert MIN_TOKENS < len(first) < 600, len(first)
    answer = cold(first)
    text = b"".join(cold_engine.piece(t) for t in answer).decode(errors="replace")
    second = follow_up(cold_engine, first, text, "And in the garage?")
    return first, second, cold(second)


def saved(engine_cache: Cache, engine: Engine, prompt: list[int]) -> str:
    run(engine, prompt)
    engine.prompt_cache_flush()
    [path] = engine_cache.files()
    return path


def test_a_restarted_engine_restores_the_prefix_with_cold_answers(cache, prompts):
    first, second, cold_answer = prompts
    one = cache.start()
    [(_, cached)] = run(one, first)
    assert cached == 0
    one.close()                                   # its queued file is written before it ends
    [path] = cache.files()
    assert one.stats()["n_prompt_cache_saves"] == 1
    assert one.stats()["n_prompt_cache_bytes_written"] == os.path.getsize(path)

    two = cache.start()
    [(tokens, cached)] = run(two, second)
    assert cached == len(first)                   # the whole first turn came from the file
    assert tokens == cold_answer                         # greedy: the cold prefill's tokens
    stats = two.stats()
    assert stats["n_prompt_cache_hits"] == 1 and stats["n_prompt_cache_misses"] == 0
    assert stats["n_prompt_cache_restored_tokens"] == len(first)
    assert stats["n_prompt_cache_bytes_read"] == os.path.getsize(path)
    assert stats["t_prompt_cache_restore_us"] > 0


def test_the_same_prompt_again_decodes_only_its_last_token(cache, prompts):
    first, _, _ = prompts
    saved(cache, cache.start(), first)
    [(tokens, cached)] = run(cache.start(), first)
    assert cached == len(first) - 1               # its logits give the first sample
    assert tokens == cold(first)


def test_two_requests_restore_one_prefix_together(cache, prompts, cold_engine):
    first, second, cold_second = prompts
    saved(cache, cache.start(), first)
    other = follow_up(cold_engine, first, "The kitchen lights.", "Turn them off.")
    engine = cache.start()
    [(a, cached_a), (b, cached_b)] = run(engine, second, other)
    assert cached_a == cached_b == len(first)
    assert (a, b) == (cold_second, cold(other))
    assert engine.stats()["n_prompt_cache_hits"] == 2


def test_a_prompt_that_parts_from_a_saved_one_restores_what_they_share(cache, prompts, cold_engine):
    """Home Assistant's pattern: the same long system prompt with another question. The file
    holds the first question too; the prefix both share is restored and the sequence cut where
    they part, as a slot's prefix reuse in memory does."""
    first, _, _ = prompts
    saved(cache, cache.start(), first)
    other = turn(cold_engine, system_text(24), "Is the garage door open?")
    shared = next(i for i, (a, b) in enumerate(zip(first, other)) if a != b)
    assert MIN_TOKENS <= shared < len(first)
    engine = cache.start()
    [(tokens, cached)] = run(engine, other)
    assert cached == shared
    assert tokens == cold(other)                  # greedy: the cold prefill's tokens
    stats = engine.stats()
    assert stats["n_prompt_cache_hits"] == 1 and stats["n_prompt_cache_restored_tokens"] == shared
    engine.prompt_cache_flush()
    assert len(cache.files()) == 1                # it adds fewer than MIN_TOKENS: no file of its own


def test_a_prefix_shorter_than_min_tokens_is_not_restored(cache, prompts, cold_engine):
    first, _, _ = prompts
    saved(cache, cache.start(), first)
    other = first[:MIN_TOKENS - 1] + cold_engine.tokenize(" and then something else entirely.", False, False)
    engine = cache.start()
    [(_, cached)] = run(engine, other + first[MIN_TOKENS:MIN_TOKENS + 8])
    assert cached == 0                            # a file read for fewer tokens than the floor: never
    assert engine.stats()["n_prompt_cache_hits"] == 0


def test_a_prompt_is_saved_when_it_adds_min_tokens_and_replaces_the_file_it_extends(cache, prompts, cold_engine):
    first, second, _ = prompts
    old = saved(cache, cache.start(), first)
    engine = cache.start()
    run(engine, second)                           # the follow-up adds a few tokens to first's
    engine.prompt_cache_flush()
    assert cache.files() == [old]
    lines = 8
    while len(longer := follow_up(cold_engine, first, "Noted.", system_text(lines, seed=7))) - len(first) < MIN_TOKENS:
        lines += 2
    assert len(longer) + MAX_TOKENS <= 1024, len(longer)
    run(engine, longer)
    engine.prompt_cache_flush()
    [new] = cache.files()                         # first's file is all at the head of the new one
    assert new != old and os.path.basename(new).split("-")[1] == str(len(longer))
    stats = engine.stats()
    assert stats["n_prompt_cache_superseded"] == 1 and stats["n_prompt_cache_saves"] == 1


@pytest.mark.parametrize("change", [
    {"prompt_cache_key": "model=another"},        # another model's digest (the runtime's part)
    {"kv_type": 8},                               # Q8_0 cells
    {"context_length": 2048},                     # another context per sequence
    {"slots": 3},                                 # another stream count
], ids=["model", "kv_type", "context_length", "slots"])
def test_another_model_kv_type_or_layout_never_restores(cache, prompts, change):
    first, second, _ = prompts
    path = saved(cache, cache.start(), first)
    engine = cache.start(prompt_cache_preload=2, **change)
    assert engine.stats()["n_prompt_cache_preloads"] == 0
    [(_, cached)] = run(engine, second)
    assert cached == 0
    stats = engine.stats()
    assert stats["n_prompt_cache_hits"] == 0 and stats["n_prompt_cache_misses"] == 1
    assert stats["n_prompt_cache_rejected"] == 0  # not even opened: not its key
    assert os.path.exists(path)                   # another key's file is left alone


def test_a_load_puts_the_saved_prefix_back_into_an_idle_slot(cache, prompts, cold_engine):
    """The restart as the daemon makes it (models.prompt_cache_preload): the file is read at
    load, so the follow-up reuses the prefix in memory, the cold prefill's tokens; a prompt with
    nothing in common asked first takes the other slot and leaves it there."""
    first, second, cold_answer = prompts
    path = saved(cache, cache.start(), first)
    engine = cache.start(prompt_cache_preload=2)
    stats = engine.stats()
    assert stats["n_prompt_cache_preloads"] == 1 and stats["n_prompt_cache_preloaded_tokens"] == len(first)
    assert stats["n_prompt_cache_bytes_read"] == os.path.getsize(path) and stats["t_prompt_cache_restore_us"] > 0
    unrelated = cold_engine.tokenize("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n", False, True)
    [(_, cached)] = run(engine, unrelated)
    assert cached == 0
    [(tokens, cached)] = run(engine, second)
    assert cached == len(first)                   # the whole first turn, from the slot in memory
    assert tokens == cold_answer
    stats = engine.stats()
    assert stats["n_prompt_cache_hits"] == 0      # a reuse in memory: nothing read at admission
    assert stats["n_prompt_cache_bytes_read"] == os.path.getsize(path)


def test_a_load_preloads_the_most_recently_used_files_at_most_its_slots(cache, cold_engine):
    """Three conversations saved, oldest first, into an engine of two slots: the two newest
    come back at load, the oldest is read from disk when asked for."""
    engine = cache.start()
    firsts = [turn(cold_engine, system_text(24, seed=seed), "Which lights are on?") for seed in (1, 2, 3)]
    for first in firsts:
        run(engine, first)
        engine.prompt_cache_flush()
    engine.close()
    assert len(cache.files()) == 3
    again = cache.start(prompt_cache_preload=64)
    assert again.stats()["n_prompt_cache_preloads"] == 2
    asked = [follow_up(cold_engine, first, "Two of them.", "And the rest?") for first in firsts]
    [(_, newest), (_, middle)] = run(again, asked[2], asked[1])
    assert newest == len(firsts[2]) and middle == len(firsts[1])
    assert again.stats()["n_prompt_cache_hits"] == 0
    [(_, oldest)] = run(again, asked[0])
    assert oldest == len(firsts[0])
    assert again.stats()["n_prompt_cache_hits"] == 1


def test_a_damaged_file_is_not_preloaded_and_is_removed(cache, prompts):
    first, second, cold_answer = prompts
    path = saved(cache, cache.start(), first)
    damage_flip(path)
    engine = cache.start(prompt_cache_preload=2)
    stats = engine.stats()
    assert stats["n_prompt_cache_preloads"] == 0 and stats["n_prompt_cache_rejected"] == 1
    assert not os.path.exists(path)
    [(tokens, cached)] = run(engine, second)
    assert cached == 0 and tokens == cold_answer


def damage_truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def damage_flip(path):
    offset = os.path.getsize(path) - 1000         # in the KV cells
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def damage_junk(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def damage_header_only(path):
    with open(path, "r+b") as f:
        f.truncate(20)


def damage_wrapping_sizes(path):
    """A header whose token count and state length add up to the file's size only by wrapping
    around 64 bits: 4 G tokens claimed (16 GiB to read them into) in a file of a few MB."""
    import struct
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(12)
        key_len = struct.unpack("<I", f.read(4))[0]
        n_tokens = 0xFFFFFFFF
        state_len = (size - 48 - key_len - n_tokens * 4) % (1 << 64)
        f.seek(16)
        f.write(struct.pack("<I", n_tokens))
        f.seek(24)
        f.write(struct.pack("<Q", state_len))


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_junk, damage_header_only,
                                    damage_wrapping_sizes],
                         ids=["truncated", "bit_flip", "junk", "cut_in_header", "wrapping_sizes"])
def test_a_damaged_file_is_a_miss_and_is_removed(cache, prompts, damage):
    first, second, cold_answer = prompts
    path = saved(cache, cache.start(), first)
    damage(path)
    engine = cache.start()
    [(tokens, cached)] = run(engine, second)
    assert cached == 0 and tokens == cold_answer
    stats = engine.stats()
    assert stats["n_prompt_cache_rejected"] == 1 and stats["n_prompt_cache_misses"] == 1
    assert stats["n_prompt_cache_hits"] == 0
    engine.prompt_cache_flush()
    assert path not in cache.files()              # removed (the follow-up is saved in its place)


def test_a_foreign_file_under_a_valid_name_is_removed(cache, tmp_path, prompts):
    """Another key's genuine file, renamed to the name this key looks for: its header says whose."""
    first, second, cold_answer = prompts
    ours = saved(cache, cache.start(), first)
    os.unlink(ours)
    other = Cache(tmp_path / "other", key="model=another")
    try:
        theirs = saved(other, other.start(), first)
    finally:
        other.close()
    os.rename(theirs, ours)
    engine = cache.start()
    [(tokens, cached)] = run(engine, second)
    assert cached == 0 and tokens == cold_answer
    assert engine.stats()["n_prompt_cache_rejected"] == 1
    engine.prompt_cache_flush()
    assert ours not in cache.files()


def test_the_shortest_prompt_saved_is_min_tokens(cache, cold_engine):
    text = system_text(40)
    tokens = cold_engine.tokenize(text, False, False)
    engine = cache.start()
    run(engine, tokens[:MIN_TOKENS - 1], max_tokens=1)
    engine.prompt_cache_flush()
    assert cache.files() == []
    run(engine, tokens[:MIN_TOKENS], max_tokens=1)
    engine.prompt_cache_flush()
    assert len(cache.files()) == 1
    assert engine.stats()["n_prompt_cache_saves"] == 1


def test_the_budget_drops_the_least_recently_used(tmp_path, cold_engine):
    a, b, c = (turn(cold_engine, system_text(20, seed), "Hello.") for seed in (0, 1, 2))
    probe = Cache(tmp_path / "probe")
    try:
        size = os.path.getsize(saved(probe, probe.start(), a))
    finally:
        probe.close()
    cache = Cache(tmp_path / "kv", budget=int(size * 2.5))   # two files fit, three do not
    try:
        engine = cache.start()
        for prompt in (a, b):
            run(engine, prompt, max_tokens=1)
            engine.prompt_cache_flush()
        [path_a, path_b] = sorted(cache.files(), key=os.path.getmtime)
        os.utime(path_a, ns=(1, 1))               # both long unused; then a is used again
        os.utime(path_b, ns=(2, 2))
        fresh = cache.start()                     # an engine that has none of them in memory
        [(_, cached)] = run(fresh, a, max_tokens=1)   # a hit (and no file of its own: a's is there)
        assert cached == len(a) - 1
        run(fresh, c, max_tokens=1)
        fresh.prompt_cache_flush()
        assert path_a in cache.files() and path_b not in cache.files()
        assert len(cache.files()) == 2
        assert fresh.stats()["n_prompt_cache_evictions"] == 1
    finally:
        cache.close()


FULL_DISK = textwrap.dedent("""
    import os, resource, signal, sys
    sys.path.insert(0, sys.argv[1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)         # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    from stackd.engine.core import Engine
    from stackd.store import defaults
    from tests.engine.conftest import Driver, chat_prompt
    from tests.engine.test_prompt_cache import system_text
    root = sys.argv[2]
    engine = Engine(defaults.smollm2_path(), slots=2, context_length=1024, batch=256,
                    prompt_cache_dir=os.path.join(root, "m"), prompt_cache_root=root,
                    prompt_cache_key="k", prompt_cache_min_tokens=256, prompt_cache_bytes=512 << 20)
    driver = Driver(engine)
    rid = driver.submit(chat_prompt(engine, system_text(40)), 4)
    result = driver.wait([rid])[rid]
    engine.prompt_cache_flush()
    stats = engine.stats()
    print(result["status"], stats["n_prompt_cache_saves"], stats["n_prompt_cache_saves_skipped"])
    engine.close()
""")


def test_a_full_disk_skips_the_save_and_the_request_goes_on(tmp_path):
    """A file size limit (RLIMIT_FSIZE) fails the write as a full disk does."""
    root = str(tmp_path / "kv")
    done = subprocess.run([sys.executable, "-c", FULL_DISK, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), root], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    status, saves, skipped = (int(x) for x in done.stdout.split())
    assert status in DONE and saves == 0 and skipped == 1
    assert "prompt cache: save of" in done.stderr and "skipped" in done.stderr
    assert os.listdir(os.path.join(root, "m")) == []     # no file, no temporary left
