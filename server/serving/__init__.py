"""The serving pipeline between the dialects (api/inference) and the runtime: what a generation
request becomes once its dialect has parsed it, and the typed output every dialect renders.

    output.py   the typed stream of one run: pieces of a choice's answer (reasoning, text, a tool
                call opening, its arguments), read back from the generated text (reader.py),
                grouped into blocks (OPEN / DELTA / CLOSE / END) for dialects that speak in
                blocks (OpenAI Responses, Anthropic Messages), and the whole answer as one
                typed Message per choice.
    reader.py   one choice's text read back as pieces while it grows, and as a Message at the end.

docs/architecture.md draws the path a request takes through it.
"""
