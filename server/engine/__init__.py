"""The engine: the native module (`native`, which loads llama.cpp once per process), the runner
that bridges an engine to the event loop, and the worker process an engine can run in.

This package imports nothing itself, so a worker process can use `wire` and `worker` without
loading llama-cpp-python (seconds and tens of MiB it does not need).
"""
