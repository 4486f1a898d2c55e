"""The native engine with the real default chat model."""
import json
import select
import time

from llama_cpp.llama_grammar import json_schema_to_gbnf
import pytest

from stackd.engine.core import STATUS_ABORTED, STATUS_LENGTH, STATUS_RUNNING, STATUS_STOPPED

from .conftest import Driver, chat_prompt

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Name three colors.", "Count from one to five.",
             "What is 2 + 2?", "Say hello in Spanish.", "What do bees make?",
             "Name a planet.", "What is ice made of?"]


def test_one_copy_of_llama_cpp_in_the_process(chat_engine):
    mapped = {line.split()[-1] for line in open("/proc/self/maps")
              if "libllama" in line and ".so" in line}
    assert len(mapped) == 1, mapped
    assert "llama_cpp/lib" in next(iter(mapped))


def test_greedy_streams_under_load_match_each_alone(driver, chat_engine):
    prompts = [chat_prompt(chat_engine, q) for q in QUESTIONS * 2]      # 16 streams
    alone = {}
    for i, prompt in enumerate(prompts[:8]):
        rid = driver.submit(prompt, max_tokens=24)
        alone[i] = driver.wait([rid])[rid]["text"]
    ids = [driver.submit(p, max_tokens=24) for p in prompts]
    together = driver.wait(ids)
    for i, rid in enumerate(ids):
        assert together[rid]["text"] == alone[i % 8], QUESTIONS[i % 8]


def test_seeded_streams_under_load_match_each_alone(driver, chat_engine):
    prompts = [chat_prompt(chat_engine, q) for q in QUESTIONS]
    alone = []
    for i, prompt in enumerate(prompts):
        rid = driver.submit(prompt, max_tokens=20, temperature=0.8, top_p=0.95, seed=100 + i)
        alone.append(driver.wait([rid])[rid]["text"])
    ids = [driver.submit(p, max_tokens=20, temperature=0.8, top_p=0.95, seed=100 + i)
           for i, p in enumerate(prompts)]
    together = driver.wait(ids)
    assert [together[rid]["text"] for rid in ids] == alone


def test_seeded_sampling_is_reproducible(driver, chat_engine):
    prompt = chat_prompt(chat_engine, "Write a word.")
    runs = []
    for _ in range(2):
        rid = driver.submit(prompt, max_tokens=16, temperature=0.9, seed=1234)
        runs.append(driver.wait([rid])[rid]["text"])
    assert runs[0] == runs[1]


def test_max_tokens_finishes_with_length(driver, chat_engine):
    rid = driver.submit(chat_prompt(chat_engine, "Tell me a long story."), max_tokens=5,
                        ignore_eos=True)
    result = driver.wait([rid])[rid]
    assert result["status"] == STATUS_LENGTH
    assert sum(e.n_tokens for e in result["events"]) == 5


def test_stop_string_is_never_emitted(driver, chat_engine):
    prompt = chat_prompt(chat_engine, "Tell me about the sea.")
    rid = driver.submit(prompt, max_tokens=40)
    full = driver.wait([rid])[rid]["text"].decode()
    assert len(full) > 20
    stop = full[12:16]                               # some text from the middle of the answer
    rid = driver.submit(prompt, max_tokens=40, stop=[stop])
    result = driver.wait([rid])[rid]
    assert result["status"] == STATUS_STOPPED
    assert result["text"].decode() == full[:full.index(stop)]


def test_cancel_frees_the_slot(chat_engine, driver):
    prompt = chat_prompt(chat_engine, "Write an essay.")
    ids = [driver.submit(prompt, max_tokens=400, ignore_eos=True) for _ in range(16)]
    waiting = driver.submit(prompt, max_tokens=3)         # the 17th waits for a slot
    time.sleep(0.3)
    for rid in ids:
        chat_engine.cancel(rid)
    results = driver.wait(ids + [waiting])
    assert all(results[rid]["status"] == STATUS_ABORTED for rid in ids)
    assert results[waiting]["status"] == STATUS_LENGTH


def test_prefix_reuse_reports_cached_tokens(driver, chat_engine):
    system = "<|im_start|>system\n" + "You answer briefly and politely. " * 20 + "<|im_end|>\n"
    first = chat_engine.tokenize(system + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", False, True)
    second = chat_engine.tokenize(system + "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", False, True)
    rid = driver.submit(first, max_tokens=4)
    driver.wait([rid])
    rid = driver.submit(second, max_tokens=4)
    events = driver.wait([rid])[rid]["events"]
    assert events[-1].n_cached >= len(chat_engine.tokenize(system, False, True)) - 2


def test_json_schema_grammar_output_parses(driver, chat_engine):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    rid = driver.submit(chat_prompt(chat_engine, "Describe a person as JSON."), max_tokens=80,
                        grammar=json_schema_to_gbnf(json.dumps(schema)))
    result = driver.wait([rid])[rid]
    value = json.loads(result["text"])
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_logprobs_are_probabilities(driver, chat_engine):
    rid = driver.submit(chat_prompt(chat_engine, "Hi"), max_tokens=3, logprobs=True, n_top_logprobs=3)
    events = driver.wait([rid])[rid]["events"]
    entries = [entry for e in events if e.logprobs for entry in e.logprobs]
    assert entries
    for token, logprob, piece, top in entries:
        assert logprob <= 0.0 and len(top) == 3
        assert top[0][1] >= logprob - 1e-4            # greedy picked the most likely token


def test_queue_refusal_when_full(chat_engine):
    from stackd.engine.core import SUBMIT_ACCEPTED, SUBMIT_QUEUE_FULL, Engine, SamplingParams
    from stackd.store import defaults
    small = Engine(defaults.smollm2_path(), slots=1, context_length=256, max_queue=2)
    driver = Driver(small)
    try:
        prompt = chat_prompt(small, "Hi")
        busy = driver.submit(prompt, max_tokens=200, ignore_eos=True)
        while True:                                  # the only slot is taken: the queue is what is left
            ready, _, _ = select.select([small.fileno()], [], [], 120)
            assert ready
            if any(e.id_request == busy for e in small.take_events()):
                break
        p = SamplingParams()
        verdicts = [small.submit(i, prompt, 200, [], p) for i in range(10, 15)]
        assert verdicts == [SUBMIT_ACCEPTED] * 2 + [SUBMIT_QUEUE_FULL] * 3
        for i in (busy, 10, 11):
            small.cancel(i)
        select.select([small.fileno()], [], [], 5)
    finally:
        small.close()
