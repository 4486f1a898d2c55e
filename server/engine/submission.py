"""What a request hands the engine: its jobs, or its prompt as text to be tokenized there.

A chat request's prompt is text once its template has rendered it. The vocabulary lives in the
model's worker (the daemon keeps no copy), so the text goes to the worker with the request
(`TextJobs`): the worker tokenizes it, checks that it fits the context, turns the thinking
budget's end tag and a grammar's prefill into tokens, and answers the verdict with the prompt's
token count, all in one exchange (vLLM's front end and llama-server's handler tokenize where
the vocabulary is too). Before, the text went to the worker to be tokenized, its tokens came
back, and went again to be submitted: two round trips before the first token, four with a
thinking template.

Jobs of token ids (completions with echo, a follower's replica, a warm-up) are a list of
(prompt tokens, max_tokens, SamplingParams), job i being choice i, as before.

This module is imported by the worker: the standard library only, at import.
"""
from __future__ import annotations

import enum


class Unfit(enum.Enum):
    """Why a prompt cannot be generated from (the request's fault, a 400)."""
    EMPTY = "prompt_empty"
    TOO_LONG = "context_length_exceeded"


def fit_error(n_prompt: int, context_length: int, what: str) -> tuple[Unfit, str] | None:
    """None when `n_prompt` tokens leave room to generate in `context_length`; else why not, in
    the words the client sees (`what`: the request field the prompt came from)."""
    if n_prompt == 0:
        return Unfit.EMPTY, f"the {what} is empty after tokenization"
    if n_prompt >= context_length:
        return Unfit.TOO_LONG, (f"this model's context is {context_length} tokens, but the {what} has "
                                f"{n_prompt} tokens and at least one token must be left to generate")
    return None


def room(n_prompt: int, max_tokens: int | None, context_length: int) -> int:
    """Tokens a job may generate: max_tokens, cut where the context ends (finish "length")."""
    left = context_length - n_prompt
    return left if max_tokens is None else min(max_tokens, left)


class TextJobs:
    """One prompt as text and its choices' sampling: the worker tokenizes it (one hop).

    `what` names the field a fit error blames ("messages", "prompt"); `reasoning_forced` (the
    thinking's end tag) and `grammar_prefill` (the generation prompt a non-lazy grammar starts
    at) are texts whose tokens go into every choice's sampling, tokenized beside the prompt.
    """

    __slots__ = ("text", "samplings", "max_tokens", "context_length", "what", "add_special",
                 "parse_special", "reasoning_forced", "grammar_prefill")

    def __init__(self, text: str, samplings: list, max_tokens: int | None, context_length: int,
                 what: str = "prompt", *, add_special: bool = False, parse_special: bool = True,
                 reasoning_forced: str | None = None, grammar_prefill: str | None = None):
        self.text, self.samplings = text, samplings
        self.max_tokens, self.context_length, self.what = max_tokens, context_length, what
        self.add_special, self.parse_special = add_special, parse_special
        self.reasoning_forced, self.grammar_prefill = reasoning_forced, grammar_prefill

    def __len__(self) -> int:
        return len(self.samplings)

    def header(self) -> dict:
        """Everything but the text and the samplings, for the worker's submit frame."""
        return {"max_tokens": self.max_tokens, "context_length": self.context_length, "what": self.what,
                "add_special": self.add_special, "parse_special": self.parse_special,
                "reasoning_forced": self.reasoning_forced, "grammar_prefill": self.grammar_prefill}

    def texts(self) -> list[tuple[str, bool, bool]]:
        """What to tokenize, as (text, add_special, parse_special): the prompt, then the
        thinking's end tag and the grammar's prefill where there are any."""
        out = [(self.text, self.add_special, self.parse_special)]
        out += [(text, False, True) for text in (self.reasoning_forced, self.grammar_prefill) if text]
        return out

    def jobs(self, tokenize) -> tuple[list, int] | tuple[Unfit, str]:
        """(jobs, prompt tokens), or (why unfit, message). `tokenize(text, add_special,
        parse_special) -> token ids` is the vocabulary's (the worker's engine, or an engine in
        this process)."""
        return self.jobs_from([tokenize(*text) for text in self.texts()])

    def jobs_from(self, tokens: list[list[int]]) -> tuple[list, int] | tuple[Unfit, str]:
        """jobs() from the token lists of texts(), in its order."""
        prompt, rest = list(tokens[0]), iter(tokens[1:])
        unfit = fit_error(len(prompt), self.context_length, self.what)
        if unfit is not None:
            return unfit
        forced = list(next(rest)) if self.reasoning_forced else None
        prefill = list(next(rest)) if self.grammar_prefill else None
        for sampling in self.samplings:
            if forced is not None:
                sampling.reasoning_forced = forced
            if prefill is not None:
                sampling.grammar_prefill = prefill
        max_tokens = room(len(prompt), self.max_tokens, self.context_length)
        return [(prompt, max_tokens, sampling) for sampling in self.samplings], len(prompt)

    @classmethod
    def from_header(cls, header: dict, text: str, samplings: list) -> "TextJobs":
        return cls(text, samplings, header["max_tokens"], int(header["context_length"]), str(header["what"]),
                   add_special=bool(header["add_special"]), parse_special=bool(header["parse_special"]),
                   reasoning_forced=header.get("reasoning_forced"), grammar_prefill=header.get("grammar_prefill"))
