"""The child side of the vocabulary check: `python -I vocab_load.py MODEL.gguf`.

Loads only the model's vocabulary with llama.cpp (`vocab_only`), the same code path
a real load takes up to the tensors, and prints `{"n_vocab": N}`. Run in a child
process by vocab_check.py, because llama.cpp answers some malformed vocabularies
with GGML_ASSERT, which aborts the whole process: here only this child dies, and its
death is the answer "cannot be loaded".

Standalone on purpose (no imports from the server package): it runs with -I, so the
script's folder is not on sys.path and nothing of the daemon is imported into it.
"""
import json
import resource
import sys

# SmolLM2's vocabulary loads in 60 MB of RSS; this bounds a runaway (a tokenizer loop that
# grows a vector until bad_alloc) to well under the machine's memory
MAX_ADDRESS_SPACE = 2 << 30


def main(path: str) -> int:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # an abort here leaves no core file
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > MAX_ADDRESS_SPACE:
        resource.setrlimit(resource.RLIMIT_AS, (MAX_ADDRESS_SPACE, hard))
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        return 1                                       # llama.cpp logged why on stderr
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        # tokenize a little text, as the first request would: the tokenizer is built now
        text = b"Hello, world!\n"
        tokens = (llama_cpp.llama_token * 64)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 64, True, True)
        if n < 0:
            print("error: tokenizing a short text failed", file=sys.stderr)
            return 1
    finally:
        llama_cpp.llama_model_free(model)
    print(json.dumps({"n_vocab": n_vocab}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
