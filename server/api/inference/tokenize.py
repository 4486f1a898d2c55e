"""POST /tokenize, POST /detokenize and GET /tokenizer_info: the model's own tokenizer, in vLLM's
shapes, with llama-server's fields (`content`, `add_special`, `parse_special`, `with_pieces`)
taken too. A text is tokenized as /v1/completions tokenizes a prompt; `messages` as
/v1/chat/completions renders and tokenizes them (the chat template, tools included)."""
from __future__ import annotations

from urllib.parse import parse_qs

from ...http import validate as V
from ...http.errors import invalid
from ...http.response import Response, json_response
from ...store.defaults import CHAT_MODEL
from ...chat import pieces as chat_pieces
from . import chat, params

# Pieces (with_pieces, return_token_strs) are looked up token by token in the model's
# vocabulary, each distinct token once: a text of this many tokens at most gets them.
MAX_PIECES = 65536

TEXT = V.String(max_len=None, allow_empty=True)
MODEL = V.String("model", max_len=256, doc="The model's id; default the most recently loaded chat model.")
FIELDS = [
    MODEL,
    V.String("prompt", max_len=None, allow_empty=True, doc="The text to tokenize (vLLM)."),
    V.String("content", max_len=None, allow_empty=True, doc="The text to tokenize (llama-server)."),
    V.Array("messages", chat.MESSAGE, min_items=1, max_items=chat.MAX_MESSAGES,
            doc="A conversation, tokenized as a chat request renders it (instead of a text)."),
    V.Boolean("add_special_tokens",
              doc="Add the tokenizer's BOS/EOS as a completion prompt gets them (vLLM; default true "
                  "for `prompt`; with `messages` the template decides)."),
    V.Boolean("add_special", doc="The same, llama-server's name (default false for `content`)."),
    V.Boolean("parse_special", default=True,
              doc="Special tokens written in the text (`<|im_end|>`) become those tokens."),
    V.Boolean("with_pieces", doc="llama-server: each token as {id, piece}."),
    V.Boolean("return_token_strs", doc="vLLM: `token_strs` beside `tokens`, each token's text."),
]
TOKENIZE_FIELDS = V.Fields(FIELDS)
DETOKENIZE_FIELDS = [
    MODEL,
    V.Array("tokens", V.Integer(lo=0), required=True, max_items=None, doc="Token ids to turn into text."),
]
DETOKENIZE = V.Fields(DETOKENIZE_FIELDS)


def _model_id(ctx, value: str | None) -> str:
    return value or ctx.models.active_chat_model() or CHAT_MODEL


async def tokenize(ctx, request) -> Response:
    body = request.json()
    v = TOKENIZE_FIELDS.read(body)
    sources = [name for name in ("prompt", "content", "messages") if v[name] is not None]
    if len(sources) != 1:
        raise invalid("give exactly one of 'prompt', 'content' (a text) or 'messages' (a conversation)",
                      sources[1] if len(sources) > 1 else "prompt")
    asked = [name for name in ("add_special_tokens", "add_special") if body.get(name) is not None]
    if len(asked) > 1:
        raise invalid("give 'add_special_tokens' or 'add_special', not both", "add_special")
    if v["messages"] is not None:
        prepared = await chat.prepare(ctx, chat.parse({**body, "model": _model_id(ctx, v["model"])}))
        model, tokens = prepared.model, await prepared.prompt_tokens()
    else:
        model = await ctx.models.get(_model_id(ctx, v["model"]), "chat")
        # vLLM adds them by default, llama-server does not
        add = v[asked[0]] if asked else v["prompt"] is not None
        text = v["prompt"] if v["prompt"] is not None else v["content"]
        tokens = (await model.runner.tokenize([text], add, v["parse_special"]))[0]
    answer = {"count": len(tokens), "max_model_len": model.context_length, "tokens": tokens}
    if v["with_pieces"] or v["return_token_strs"]:
        field = "with_pieces" if v["with_pieces"] else "return_token_strs"
        if len(tokens) > MAX_PIECES:
            raise invalid(f"'{field}' is answered for at most {MAX_PIECES} tokens; this text has "
                          f"{len(tokens)}", field)
        pieces = await chat_pieces.of(model.runner, f"{model.id}@{model.manifest.sha256}", tokens)
        if v["return_token_strs"]:
            answer["token_strs"] = [p.decode("utf-8", "replace") for p in pieces]
        if v["with_pieces"]:
            answer["tokens"] = [{"id": t, "piece": chat_pieces.shown(p)} for t, p in zip(tokens, pieces)]
    return json_response(answer)


async def detokenize(ctx, request) -> Response:
    v = DETOKENIZE.read(request.json())
    model = await ctx.models.get(_model_id(ctx, v["model"]), "chat")
    tokens = v["tokens"]
    n_vocab = model.engine.n_vocab
    for i, token in enumerate(tokens):
        if token >= n_vocab:
            raise invalid(f"'tokens[{i}]' ({token}) is outside the vocabulary (0..{n_vocab - 1})", "tokens")
    # control tokens as their text (<|im_end|>), as vLLM and llama-server give them back
    text = (await model.runner.detokenize(tokens, special=True)).decode("utf-8", "replace") if tokens else ""
    return json_response({"prompt": text, "content": text})


async def tokenizer_info(ctx, request) -> Response:
    """What lm-evaluation-harness's remote tokenizer (and vLLM's clients) read first: the special
    tokens' texts, the chat template and the context length of the model named in `?model=`
    (default: the most recently loaded chat model)."""
    named = parse_qs(request.query or "").get("model")
    model_id = _model_id(ctx, named[-1] if named else None)
    params.MODEL.check(model_id, "model")
    model = await ctx.models.get(model_id, "chat")
    facts = model.engine.template_facts
    return json_response({
        "tokenizer_class": "llama.cpp", "model": model.id,
        "bos_token": facts.get("bos_text") or None, "eos_token": facts.get("eos_text") or None,
        "pad_token": None, "chat_template": facts.get("chat_template") or None,
        "model_max_length": model.context_length, "max_model_len": model.context_length,
        "vocab_size": model.engine.n_vocab})

