"""Engine workers as the daemon starts them: the spare spawned at boot, and the worker's own
vocabulary tokenizing for the daemon (which keeps none). Real worker processes, the real
default chat model."""
import asyncio

import pytest

from stackd import config
from stackd.engine.core import Vocab, template_facts
from stackd.engine.errors import EngineError, ErrorCode
from stackd.runtime.clients import WorkerEngine
from stackd.runtime.runner import ModelRunner
from stackd.runtime.worker_process import SpareWorker, spare_for_boot
from stackd.store import defaults

TEXTS = ["Hello, world!", "<|im_start|>user\nhi<|im_end|>\n", "naïve café, 東京 🚀", "", "a" * 5000]


def params() -> dict:
    return dict(model_path=defaults.smollm2_path(), slots=2, context_length=256, batch=64, threads=1)


@pytest.fixture(scope="module")
def vocab():
    return Vocab(defaults.smollm2_path())


def run(coroutine):
    return asyncio.run(coroutine)


async def started(process=None) -> WorkerEngine:
    return await WorkerEngine.start(asyncio.get_running_loop(), params(), process=process)


def test_the_workers_vocabulary_tokenizes_as_the_model_file_does(vocab):
    async def scenario():
        client = await started()
        runner = ModelRunner(asyncio.get_running_loop(), client)
        try:
            return (await runner.tokenize(TEXTS, False, True), await runner.tokenize(TEXTS, True, False),
                    await runner.detokenize(vocab.tokenize(TEXTS[2], False, False)), client.template_facts)
        finally:
            await runner.close()

    parsed, plain, text, facts = run(scenario())
    assert parsed == [vocab.tokenize(t, False, True) for t in TEXTS]
    assert plain == [vocab.tokenize(t, True, False) for t in TEXTS]
    assert text == TEXTS[2].encode()
    assert facts == template_facts(vocab) and "im_start" in facts["chat_template"]
    # the text of the control tokens a template may write (llama.cpp's server renders them so)
    assert (facts["bos_text"], facts["eos_text"]) == ("<|im_start|>", "<|im_end|>")


def test_a_tokenize_in_flight_when_the_model_unloads_fails_rather_than_waits():
    async def scenario():
        client = await started()
        pending = asyncio.ensure_future(client.tokens_of(["a long text " * 1000], True, False))
        await asyncio.sleep(0)                  # sent, its answer not read yet
        await client.aclose()
        with pytest.raises(EngineError) as caught:
            await asyncio.wait_for(pending, 60)
        return caught.value.code

    assert run(scenario()) is ErrorCode.UNLOADED


def test_a_spare_worker_serves_the_first_load_with_its_policy_and_only_that():
    async def scenario():
        spare = SpareWorker("inherit")
        pid = spare.process[0].pid
        assert spare.take("passive") is None       # another OpenMP policy: not this process
        process = spare.take("inherit")
        assert spare.take("inherit") is None       # once
        client = await started(process)
        runner = ModelRunner(asyncio.get_running_loop(), client)      # it reads the worker's answers
        try:
            return pid, client.pid, await runner.tokenize(["Hello"], False, False)
        finally:
            await runner.close()

    pid, worker_pid, tokens = run(scenario())
    assert worker_pid == pid and tokens[0]


def test_a_spare_worker_no_load_took_is_stopped():
    spare = SpareWorker("inherit")
    proc = spare.process[0]
    spare.stop()
    assert proc.poll() is not None and spare.take("inherit") is None


def test_a_spare_worker_that_died_is_not_handed_out():
    spare = SpareWorker("inherit")
    proc = spare.process[0]
    proc.kill()
    proc.wait()
    assert spare.take("inherit") is None


@pytest.mark.parametrize("toml, wanted", [
    ("", True),                                              # a leader preloading its defaults
    ("[engine]\nisolation = \"inline\"\n", False),           # no worker to start
    ("[models]\npreload = []\n", False),                     # nothing to load at start
])
def test_a_boot_spawns_a_spare_only_when_a_preload_will_take_it(tmp_path, toml, wanted):
    (tmp_path / "config.toml").write_text(toml)
    settings = config.load({"data_dir": str(tmp_path), "config": str(tmp_path / "config.toml")})
    spare = spare_for_boot(settings)
    try:
        assert (spare is not None) == wanted
    finally:
        if spare is not None:
            spare.stop()


def test_a_long_text_is_tokenized_beside_the_workers_loop_which_answers_short_ones_meanwhile(vocab):
    long_text = "tokenize this sentence, word by word. " * 60000        # ~2.3 MB: ~0.5 s of work

    async def scenario():
        client = await started()
        runner = ModelRunner(asyncio.get_running_loop(), client)
        order = []

        async def tokenize(name, text):
            tokens = await runner.tokenize([text], False, False)
            order.append(name)
            return tokens[0]

        try:
            long_task = asyncio.ensure_future(tokenize("long", long_text))
            await asyncio.sleep(0)                                  # sent first
            short = await tokenize("short", "Hello")
            seen = order[:]
            long_tokens = await long_task
            return seen, short, long_tokens, await runner.detokenize(long_tokens)   # joined beside too
        finally:
            await runner.close()

    order, short, long_tokens, text = run(scenario())
    assert order == ["short"]                       # answered while the long text was still going
    assert short == vocab.tokenize("Hello", False, False)
    assert long_tokens == vocab.tokenize(long_text, False, False)
    assert text == long_text.encode()
