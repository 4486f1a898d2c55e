"""Ollama's API (its own port, 11434 by default, off unless turned on): a dialect of the serving
pipeline. Each route parses its body into the typed request the other dialects use and renders
the typed output as Ollama's objects; models, keys, limits and fairness are port 8080's."""
