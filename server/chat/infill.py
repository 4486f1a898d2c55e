"""Fill-in-the-middle prompts, token for token as llama-server builds them
(tools/server/server-common.cpp, format_prompt_infill, llama.cpp as llama-cpp-python 0.3.36
ships it), for the models whose vocabulary has FIM tokens.

The repository-level pattern (https://arxiv.org/pdf/2409.12186), each marker present only when
the model has its token:

    [FIM_REP]myproject\n [FIM_SEP]filename0\n extra chunk 0 ... [FIM_SEP]filename\n
    [BOS] [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

(suffix first with spm_infill, which llama-server leaves off). The prefix keeps its last
3/4 of a batch of tokens, the suffix up to a quarter batch less the prompt; the extra context
(input_extra, newest last) fills what is left of the context after a batch and twice the
prediction, taken from its end. llama-server's defaults stand in for its command-line settings:
a batch of 2,048 and no prediction limit (-1).
"""
from __future__ import annotations

from dataclasses import dataclass

# llama-server's defaults for the settings format_prompt_infill reads (common.h)
N_BATCH = 2048
N_PREDICT = -1
REPO_NAME = "myproject\n"          # llama-server's: "TODO: make project name an input"
FILE_NAME = "filename\n"           # the current file's, likewise
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"   # between extra chunks when the model has no FIM_SEP

# The GGUF keys that declare the FIM tokens (llama.cpp's LLM_KV_TOKENIZER_FIM_*_ID, and the
# older CodeLlama prefix/suffix/middle keys), and the token texts llama.cpp recognises when a
# model does not declare them (llama-vocab.cpp), by role.
DECLARED = {"pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
            "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
            "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
            "pad": ("tokenizer.ggml.fim_pad_token_id",),
            "rep": ("tokenizer.ggml.fim_rep_token_id",),
            "sep": ("tokenizer.ggml.fim_sep_token_id",)}
RECOGNISED = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
REQUIRED = ("pre", "suf", "mid")


@dataclass(frozen=True)
class FimTokens:
    """A model's FIM tokens (None: it has none for that role) and whether it starts a text with BOS."""
    pre: int | None
    suf: int | None
    mid: int | None
    pad: int | None
    rep: int | None
    sep: int | None
    bos: int | None           # the BOS its tokenizer adds to a text, None when it adds none

    def missing(self) -> list[str]:
        """The roles an infill needs that the model has no token for."""
        return [role for role in REQUIRED if getattr(self, role) is None]


async def fim_tokens(declared: dict[str, int], tokenize) -> FimTokens:
    """The FIM tokens as llama.cpp's vocabulary ends up with them: the ids the GGUF declares
    (`declared`: role -> id, already checked against the vocabulary), else a token whose text
    llama.cpp recognises for the role. `tokenize(texts, add_special, parse_special)`."""
    found = dict(declared)
    roles = [role for role in RECOGNISED if role not in found]
    texts = [text for role in roles for text in RECOGNISED[role]]
    special = await tokenize(texts, False, True) if texts else []
    at = 0
    for role in roles:
        for text in RECOGNISED[role]:
            tokens = special[at]
            at += 1
            if role not in found and len(tokens) == 1:
                found[role] = tokens[0]
    (plain,), (marked,) = await tokenize(["a"], False, False), await tokenize(["a"], True, False)
    adds_bos = len(marked) > len(plain) and marked[1:1 + len(plain)] == plain   # llama_vocab_get_add_bos
    bos = marked[0] if adds_bos else None
    return FimTokens(**{role: found.get(role) for role in DECLARED}, bos=bos)


def _mixed(value) -> list:
    """llama-server's prefix/suffix: a string, or an array of strings and token ids."""
    return [value] if isinstance(value, str) else list(value)


async def prompt_tokens(fim: FimTokens, tokenize, input_prefix, input_suffix, input_extra: list[dict],
                        prompt: str, n_ctx: int, *, n_batch: int = N_BATCH, n_predict: int = N_PREDICT,
                        spm_infill: bool = False) -> list[int]:
    """The infill prompt (format_prompt_infill). `input_extra`: [{"text", "filename"?}]."""
    async def mixed(value) -> list[int]:
        parts = _mixed(value)
        texts = [p for p in parts if isinstance(p, str)]
        tokenized = iter(await tokenize(texts, False, False)) if texts else iter(())
        out: list[int] = []
        for part in parts:
            out.extend(next(tokenized) if isinstance(part, str) else [part])
        return out

    texts = [REPO_NAME, FILE_NAME, CHUNK_SEPARATOR]
    for chunk in input_extra:
        texts += [chunk.get("filename", "tmp") + "\n", chunk["text"]]
    tokenized = await tokenize(texts, False, False)
    repo_name, file_name, separator = tokenized[:3]
    prompt_part = (await tokenize([prompt], False, True))[0] if prompt else []
    tokens_prefix, tokens_suffix = await mixed(input_prefix), await mixed(input_suffix)

    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *repo_name]
    for i in range(len(input_extra)):
        chunk_file, chunk_text = tokenized[3 + 2 * i], tokenized[4 + 2 * i]
        extra += [fim.sep, *chunk_file] if fim.sep is not None else separator
        extra += chunk_text
    if fim.sep is not None:
        extra += [fim.sep, *file_name]

    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(prompt_part))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))

    tokens_prefix = [fim.pre, *tokens_prefix[len(tokens_prefix) - n_prefix_take:], *prompt_part]
    tokens_suffix = [fim.suf, *tokens_suffix[:n_suffix_take]]
    first, second = (tokens_suffix, tokens_prefix) if spm_infill else (tokens_prefix, tokens_suffix)
    head = [fim.bos] if fim.bos is not None else []
    return [*extra[len(extra) - n_extra_take:], *head, *first, *second, fim.mid]
