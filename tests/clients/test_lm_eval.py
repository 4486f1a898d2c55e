"""lm-evaluation-harness, unchanged (lm-eval[api], pinned), against the daemon and the default
chat model, offline: its `local-completions` model scores a small multiple-choice task (echo with
logprobs: every prompt token's log-probability) and runs a generate_until task, and its
`local-chat-completions` model runs the generate_until task through the chat template. The tasks
come from local JSON files; the tokenizer is lm-eval's remote one, over the daemon's
/tokenizer_info, /tokenize and /detokenize (no model hub). Each item's log-likelihood is the
engine's own for the same tokens, within 1e-3: the sum of the log-probabilities the engine
reports when it samples each continuation token (forced by a logit bias) after the tokens
before it."""
import json
import math

import pytest

MC_DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "London", "a banana"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["four", "seven", "purple"], "answer": 0},
    {"question": "The opposite of hot is", "choices": ["cold", "loud", "Tuesday"], "answer": 0},
    {"question": "A dog says", "choices": ["woof", "meow", "quack"], "answer": 0},
]
GEN_DOCS = [
    {"question": "Q: What is the capital of France?\nA:", "answer": "Paris"},
    {"question": "Q: What color is the sky on a clear day?\nA:", "answer": "Blue"},
]
CLOSE = 1e-3


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """No model hub, no dataset hub: lm-eval and the datasets library read only local files."""
    home = tmp_path_factory.mktemp("hf-home")
    patch = pytest.MonkeyPatch()
    for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                        "HF_HOME": str(home), "HF_DATASETS_CACHE": str(home / "datasets")}.items():
        patch.setenv(name, value)
    yield home
    patch.undo()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    for name, docs in (("mc", MC_DOCS), ("gen", GEN_DOCS)):
        with open(folder / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(doc) + "\n" for doc in docs)
    data = lambda name: {"data_files": {"test": str(folder / f"{name}.jsonl")}}  # noqa: E731
    multiple_choice = {
        "task": "stackd_mc", "dataset_path": "json", "dataset_kwargs": data("mc"), "test_split": "test",
        "output_type": "multiple_choice", "doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]}
    generate_until = {
        "task": "stackd_gen", "dataset_path": "json", "dataset_kwargs": data("gen"), "test_split": "test",
        "output_type": "generate_until", "doc_to_text": "{{question}}", "doc_to_target": " {{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False, "temperature": 0},
        "metric_list": [{"metric": "exact_match", "ignore_case": True, "ignore_punctuation": True}]}
    return multiple_choice, generate_until


def evaluate(model: str, model_args: dict, tasks: list, **kwargs) -> dict:
    import lm_eval
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, log_samples=True,
                                   batch_size=1, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                   fewshot_random_seed=0, **kwargs)


def post(daemon, path, body):
    status, _, answer = daemon.request("POST", path, port="inference", body=body, key=daemon.admin_key)
    assert status == 200, answer
    return answer


def engine_loglikelihood(daemon, context: str, continuation: str) -> float:
    """The engine's own log-likelihood of `continuation` after `context`, tokenized as lm-eval
    tokenizes a pair (trailing spaces of the context go to the continuation; the whole encoded,
    then split), token by token as the engine reports a token it samples."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = post(daemon, "/tokenize", {"prompt": context + continuation, "add_special_tokens": False})["tokens"]
    n_context = len(post(daemon, "/tokenize", {"prompt": context, "add_special_tokens": False})["tokens"])
    total = 0.0
    for i in range(n_context, len(whole)):
        answer = post(daemon, "/v1/completions", {
            "model": "smollm2-135m-instruct", "prompt": whole[:i], "max_tokens": 1, "temperature": 0,
            "logprobs": 1, "logit_bias": {str(whole[i]): 100}})
        total += answer["choices"][0]["logprobs"]["token_logprobs"][0]
    return total


def test_local_completions_scores_multiple_choice_and_generates(daemon, base_url, api_key, tasks, offline,
                                                                monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", api_key)           # what local-completions sends as its key
    multiple_choice, generate_until = tasks
    results = evaluate("local-completions", {
        "model": "smollm2-135m-instruct", "base_url": f"{base_url}/completions", "tokenizer_backend": "remote",
        "auth_token": api_key, "num_concurrent": 1, "max_retries": 1, "timeout": 600},
        [multiple_choice, generate_until])

    samples = results["samples"]["stackd_mc"]
    assert len(samples) == len(MC_DOCS)
    for sample in samples:
        assert len(sample["resps"]) == len(sample["doc"]["choices"])
        for (context, continuation), ((loglikelihood, _greedy),) in zip(
                (r for r in sample["arguments"]), sample["resps"]):
            assert math.isfinite(loglikelihood) and loglikelihood < 0
            assert abs(loglikelihood - engine_loglikelihood(daemon, context, continuation)) < CLOSE
    assert results["results"]["stackd_mc"]["acc,none"] >= 0.5          # a 135M model knows these

    generated = results["samples"]["stackd_gen"]
    assert len(generated) == len(GEN_DOCS)
    for sample in generated:
        (text,) = sample["resps"][0]
        assert isinstance(text, str) and "\n" not in text              # `until` ended it
        again = post(daemon, "/v1/completions", {"model": "smollm2-135m-instruct", "prompt": sample["arguments"][0][0],
                                                 "max_tokens": 8, "temperature": 0, "stop": ["\n"]})
        assert text == again["choices"][0]["text"]                    # greedy: the engine's own answer


def test_local_chat_completions_generates(daemon, base_url, api_key, tasks, offline, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    _, generate_until = tasks
    results = evaluate("local-chat-completions", {
        "model": "smollm2-135m-instruct", "base_url": f"{base_url}/chat/completions", "num_concurrent": 1,
        "max_retries": 1, "timeout": 600}, [generate_until], apply_chat_template=True)
    generated = results["samples"]["stackd_gen"]
    assert len(generated) == len(GEN_DOCS)
    assert all(isinstance(s["resps"][0][0], str) for s in generated)
    assert "exact_match,none" in results["results"]["stackd_gen"]
