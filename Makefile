# Two commands on a fresh machine (Python 3.11, gcc, cmake):
#   make run    set up, then start the daemon (127.0.0.1:8080 inference, 127.0.0.1:5381 cluster)
#   make test   set up, then run the whole suite
# `make setup` only sets up. Every step is stamped, so repeating one is fast.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
DATA_DIR ?= data
PYTEST_ARGS ?=

NATIVE_INPUTS := setup.py server/native.py $(wildcard server/*.py server/http/*.py server/auth/*.py) \
                 $(wildcard CMakeLists.txt) $(shell find native -type f 2>/dev/null)

.PHONY: setup run test bench clean

setup: $(VENV)/.native

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps: requirements.txt requirements-dev.txt | $(PY)
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	touch $@

$(VENV)/.native: $(VENV)/.deps $(NATIVE_INPUTS)
	$(PY) setup.py -q build_ext --inplace
	touch $@

run: setup
	$(PY) -m server serve --data-dir $(DATA_DIR)

# The protocol and unit suites run twice: compiled, then on the Python twins.
test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
	STACKD_PURE_PYTHON=1 $(PY) -m pytest tests/protocol tests/unit $(PYTEST_ARGS)

bench: setup
	$(PY) bench/http_health.py

clean:
	rm -rf build $(VENV) server/**/*.so server/*.so
	find server -name '*.c' -delete
