"""The pure parts of prompt log-probabilities and fill-in-the-middle, without an engine: OpenAI's
legacy logprobs shape with a scored prompt (the first token null, offsets in characters),
which job asks the engine for the rows, max_tokens 0, and llama-server's infill arithmetic
(what is kept of the prefix, the suffix and the extra files) over a fake tokenizer."""
import asyncio

from stackd.api.inference.responses import Choice, completion_logprobs
from stackd.chat import echo_logprobs, infill
from stackd.engine.core import SamplingParams


def test_a_scored_prompt_comes_first_with_a_null_first_token():
    prompt_rows = [(2, -1.5, b" world", [(2, -1.5, b" world"), (3, -2.0, b" there")])]
    generated = [(4, -0.25, b"!", [(4, -0.25, b"!")])]
    out = completion_logprobs(generated, 0, (b"Hello", prompt_rows))
    assert out["tokens"] == ["Hello", " world", "!"]
    assert out["token_logprobs"] == [None, -1.5, -0.25]
    assert out["top_logprobs"] == [None, {" world": -1.5, " there": -2.0}, {"!": -0.25}]
    assert out["text_offset"] == [0, 5, 11]


def test_offsets_count_characters_a_split_one_at_the_token_that_completes_it():
    smile = "🙂".encode()
    rows = [(1, -1.0, smile[:2], []), (2, -1.0, smile[2:], []), (3, -1.0, b"x", [])]
    out = completion_logprobs([], 0, (b"a", rows))
    assert out["text_offset"] == [0, 1, 1, 2]          # "a🙂x": the emoji is one character


def test_generated_entries_alone_keep_their_offset_after_the_echoed_text():
    out = completion_logprobs([(1, -0.5, b"ab", []), (2, -0.5, b"c", [])], 7)
    assert out["text_offset"] == [7, 9] and out["token_logprobs"] == [-0.5, -0.5]


def test_only_the_first_choice_of_each_prompt_asks_for_the_rows():
    base = SamplingParams()
    jobs = [([1, 2], 1, base), ([1, 2], 1, base), ([3, 4], 1, base), ([3, 4], 1, base)]
    scored = echo_logprobs.scoring(jobs, 2)
    assert [s.prompt_logprobs for _, _, s in scored] == [True, False, True, False]
    assert base.prompt_logprobs is False                  # the request's own params untouched
    choices = [Choice() for _ in range(4)]
    choices[0].prompt_logprobs, choices[2].prompt_logprobs = ["a"], ["b"]
    echo_logprobs.share_rows(choices, 2)
    assert [c.prompt_logprobs for c in choices] == [["a"], ["a"], ["b"], ["b"]]


def test_max_tokens_zero_shows_nothing_generated():
    choice = Choice()
    choice.text, choice.logprobs, choice.n_generated, choice.finish_reason = [b"x"], [1], 1, "stop"
    echo_logprobs.nothing_generated([choice])
    assert (choice.text, choice.logprobs, choice.n_generated, choice.finish_reason) == ([], [], 0, "length")


def fake_tokenize(texts, add_special, parse_special):
    """One token per character (its code point + 1000), BOS 1 when asked."""
    async def run():
        return [([1] if add_special else []) + [1000 + ord(c) for c in text] for text in texts]
    return run()


FIM = infill.FimTokens(pre=10, suf=11, mid=12, pad=None, rep=13, sep=14, bos=None)


def build(**kw):
    args = dict(fim=FIM, tokenize=fake_tokenize, input_prefix="ab", input_suffix="cd", input_extra=[],
                prompt="", n_ctx=4096)
    args.update(kw)
    return asyncio.run(infill.prompt_tokens(**args))


def t(text):
    return [1000 + ord(c) for c in text]


def test_the_repository_pattern():
    tokens = build(input_extra=[{"filename": "f.py", "text": "xy"}], prompt="p")
    assert tokens == [13, *t("myproject\n"), 14, *t("f.py\n"), *t("xy"), 14, *t("filename\n"),
                      10, *t("ab"), *t("p"), 11, *t("cd"), 12]


def test_what_is_kept_of_prefix_suffix_and_extra():
    tokens = build(input_prefix="a" * 2000, input_suffix="b" * 600, prompt="pp", n_ctx=2060,
                   input_extra=[{"filename": "f", "text": "z" * 50}])
    pre, suf = tokens.index(10), tokens.index(11)
    assert pre == 14                                    # n_ctx - n_batch + 2 extra tokens, from the end
    assert tokens[pre + 1:suf] == [1000 + ord("a")] * 1536 + t("pp")   # 3/4 of a batch, then the prompt
    assert tokens[suf + 1:-1] == [1000 + ord("b")] * (512 - 2 - 2)     # a quarter batch less 2 and the prompt
    assert tokens[-1] == 12


def test_no_fim_sep_puts_llama_servers_snippet_separator_between_chunks():
    fim = infill.FimTokens(pre=10, suf=11, mid=12, pad=None, rep=None, sep=None, bos=1)
    tokens = build(fim=fim, input_extra=[{"text": "q"}])
    assert tokens == [*t("\n\n--- snippet ---\n\n"), *t("q"), 1, 10, *t("ab"), 11, *t("cd"), 12]
    assert fim.missing() == [] and infill.FimTokens(None, 1, None, None, None, None, None).missing() == ["pre", "mid"]


def test_spm_order_and_mixed_token_prefixes():
    tokens = build(input_prefix=["a", 77, "b"], spm_infill=True)
    assert tokens == [13, *t("myproject\n"), 14, *t("filename\n"), 11, *t("cd"), 10, *t("a"), 77, *t("b"), 12]
