# Two commands on a fresh machine (Python 3.11, gcc, cmake):
#   make run    set up, then start the daemon (127.0.0.1:8080 inference, 127.0.0.1:5381 cluster,
#               127.0.0.1:8000 the console)
#   make test   set up, then run the whole suite
# `make setup` only sets up. Every step is stamped, so repeating one is fast.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
DATA_DIR ?= data
PYTEST_ARGS ?=
# seconds of fuzzing: the fuzz targets' share of `make test`, in all; `make fuzz`'s hypothesis
# run (then atheris runs as long again)
TEST_FUZZ_SECONDS ?= 60
FUZZ_SECONDS ?= 600

NATIVE_INPUTS := setup.py server/compiled.py $(wildcard server/*.py server/http/*.py server/auth/*.py) \
                 server/observe/metrics.py \
                 CMakeLists.txt $(shell find native kernels -name '*.cpp' -o -name '*.h' 2>/dev/null) \
                 kernels/CMakeLists.txt kernels/fetch_ggml_source.py $(wildcard packaging/native/*.cpp)
MINILM := $(VENV)/share/stackd/models/all-minilm-l6-v2.gguf

.PHONY: setup run test test-deps cross-deps image-cross-deps bench fuzz clean mutate wheels image test-image test-image-stage test-aarch64

# uPlot, the console dashboard's charts: a pinned version from the npm registry, its published
# sha512 checked, served by the console as a static file (no CDN: the console works offline)
UPLOT := server/console/static/uplot.version

setup: $(VENV)/.native $(VENV)/.editable $(MINILM) $(DATA_DIR)/models/.defaults $(UPLOT)

$(UPLOT): server/console/fetch_uplot.py | $(PY)
	$(PY) server/console/fetch_uplot.py

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps: requirements.txt requirements-dev.txt requirements-nodeps.txt | $(PY)
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	$(PIP) install --no-deps -r requirements-nodeps.txt
	touch $@

# llama-cpp-python, built from source with ggml's RPC backend, cached in .wheelhouse/ (and in
# this machine's ~/.cache/stackd/wheelhouse, which a second checkout copies from)
$(VENV)/.llama: $(VENV)/.deps native/llama_wheel.py
	$(PIP) install --no-deps --force-reinstall "$$($(PY) native/llama_wheel.py)"
	touch $@

$(VENV)/.native: $(VENV)/.llama $(NATIVE_INPUTS)
	$(PY) setup.py -q build_ext --inplace
	touch $@

# The checkout as the package `stackd` (an editable install: the folder server/ is the package,
# and the `stackd` command). Its native modules are the ones build_ext put in place above.
$(VENV)/.editable: $(VENV)/.llama setup.py pyproject.toml
	STACKD_NO_NATIVE_BUILD=1 $(PIP) install --no-build-isolation --no-deps -e .
	touch $@

# The default models in the store of `make run`'s data dir (the daemon also does this on a
# first start in any other data dir).
$(DATA_DIR)/models/.defaults: $(VENV)/.native $(VENV)/.editable $(MINILM)
	$(VENV)/bin/stackd models defaults --data-dir $(DATA_DIR)
	touch $@

$(MINILM): $(VENV)/.deps native/minilm_gguf.py
	mkdir -p $(dir $@)
	$(PY) native/minilm_gguf.py $@

run: setup
	$(VENV)/bin/stackd serve --console --data-dir $(DATA_DIR)

# A device install without a registry (README, "Build a device image"): dist/ holds the stackd
# wheel (native code inside), llama-cpp-python's portable build (ggml's CPU variants chosen at
# run time; cached in .wheelhouse/), every runtime dependency and the default models' wheels.
#
# `make wheels ARCH=aarch64`: the same set for arm64 boards, cross-built here into dist-aarch64/
# (Debian's cross compilers, Debian bookworm's arm64 Python 3.11 headers; packaging/wheels.py),
# installed on the board with `pip install --no-index --find-links dist-aarch64 stackd`. The
# cross-built llama-cpp-python is cached in .wheelhouse/ as the x86 one is.
HOST_ARCH := $(shell uname -m)
ARCH ?= $(HOST_ARCH)
CROSS_ARCHES := aarch64
DIST := $(if $(filter $(HOST_ARCH),$(ARCH)),dist,dist-$(ARCH))
wheels: $(VENV)/.deps $(MINILM) $(if $(filter $(HOST_ARCH),$(ARCH)),,cross-deps)
	@if [ "$(ARCH)" != "$(HOST_ARCH)" ] && [ -z "$(filter $(ARCH),$(CROSS_ARCHES))" ]; then \
	  echo "make wheels: ARCH=$(ARCH): this machine ($(HOST_ARCH)) builds for itself or $(CROSS_ARCHES)"; exit 1; fi
	$(PY) packaging/wheels.py $(DIST) $(MINILM) $(if $(filter $(HOST_ARCH),$(ARCH)),,--arch $(ARCH))

# A bootable disk image of a device (README, "Build a device image"): Debian bookworm from
# Debian's packages (mmdebstrap), dist/'s wheels installed into /opt/stackd, the unit enabled,
# the default models in the store; cached in build/image/ under its inputs. Prints where its
# space goes and, last, its path. `make image ARCH=aarch64`: the arm64 one (UEFI, GPT) from
# dist-aarch64/, into build/image-aarch64/, the same recipe (packaging/image/build.py --arch).
IMAGE_DIR := build/image$(if $(filter $(HOST_ARCH),$(ARCH)),,-$(ARCH))
image: wheels test-deps $(if $(filter $(HOST_ARCH),$(ARCH)),,image-cross-deps)
	$(PY) packaging/image/build.py $(if $(filter $(HOST_ARCH),$(ARCH)),,--arch $(ARCH)) $(DIST) $(IMAGE_DIR)

# System packages the tests need: the CNCF distribution registry (Debian's docker-registry)
# that the pull tests run on loopback; PostgreSQL, which the console tests start in a temp dir;
# Chromium and its driver, in which the console's web page is tested; iproute2, whose `ip`
# puts cluster nodes in network namespaces (testing.netns; the tests marked netns).
# For the device image (tests/image): mmdebstrap builds it, debugfs (e2fsprogs) reads and
# writes its file system, qemu boots it, systemd-analyze rates the unit, and Debian's aarch64
# cross compilers build the native parts for aarch64, and qemu's user mode runs our kernels'
# aarch64 paths (tests/kernels/test_aarch64.py).
# The aarch64 build and its checks (`make wheels ARCH=aarch64`, `make test-aarch64`): the cross
# compilers, mmdebstrap (the arm64 Python headers' sysroot, the arm64 root the wheels are
# installed into) and qemu's user mode, which runs arm64 programs here.
CROSS_PACKAGES := g++-aarch64-linux-gnu:aarch64-linux-gnu-g++ mmdebstrap:mmdebstrap \
                  qemu-user-static:qemu-aarch64-static
# The arm64 image (`make image ARCH=aarch64`) and its boot: the EFI system partition's FAT
# (dosfstools, mtools), qemu-system-aarch64 and its UEFI firmware (EDK2's ArmVirtQemu).
IMAGE_CROSS_PACKAGES := dosfstools:mkfs.fat mtools:mcopy qemu-system-arm:qemu-system-aarch64 \
                        qemu-efi-aarch64:/usr/share/qemu-efi-aarch64/QEMU_EFI.fd
TEST_PACKAGES := docker-registry:docker-registry postgresql:initdb chromium:chromium \
                 chromium-driver:chromedriver iproute2:ip e2fsprogs:debugfs \
                 qemu-system-x86:qemu-system-x86_64 systemd:systemd-analyze $(CROSS_PACKAGES)
# $(call debian_packages,LIST,WHO): install what of LIST (package:command) is missing
debian_packages = @missing=""; for entry in $(1); do \
	  command -v "$${entry\#*:}" >/dev/null 2>&1 || [ -x /usr/lib/postgresql/15/bin/$${entry\#*:} ] \
	    || [ -e "$${entry\#*:}" ] \
	    || missing="$$missing $${entry%%:*}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "$(2) needs Debian's$$missing: sudo apt-get install$$missing"; exit 1; fi; fi
test-deps:
	$(call debian_packages,$(TEST_PACKAGES),make test)
cross-deps:
	$(call debian_packages,$(CROSS_PACKAGES),make wheels ARCH=$(ARCH))
image-cross-deps:
	$(call debian_packages,$(IMAGE_CROSS_PACKAGES),make image ARCH=$(ARCH))

# The fast suites run twice: compiled, then on the Python twins of the compiled modules.
FAST_SUITES := tests/http tests/auth tests/api tests/chat tests/runtime tests/system \
               tests/store/test_store.py tests/store/test_gguf_check.py \
               tests/store/test_minilm_gguf.py tests/cluster/test_power.py \
               tests/observe/test_metrics_render.py tests/engine/test_native_surface.py \
               tests/test_compiled.py tests/test_config.py tests/test_faults.py tests/test_startup_imports.py
#
# Then the device image's stage (tests/image: the aarch64 cross build; `make image` and its boot
# under qemu). From nothing it costs ~25-35 min on two cores (llama.cpp's portable build, the
# wheels, Debian's packages, two boots under TCG), so in CI (CI set), which has 90 minutes in
# all, it runs within what is left of CI_MINUTES since `make test` began: skipped, or cut, with
# a line that says so, rather than costing the whole run. Elsewhere it always runs to the end.
TEST_STARTED := $(shell date +%s)
CI_MINUTES ?= 84
IMAGE_STAGE_MIN_SECONDS ?= 900

# In CI the suites themselves have a deadline too (tests/conftest.py, SUITE_DEADLINE): what has
# not run SUITE_BUDGET_MARGIN_MIN minutes before CI_MINUTES is skipped with a line that says so.
SUITE_BUDGET_MARGIN_MIN ?= 6
SUITE_DEADLINE = $(if $(CI),$$(( $(TEST_STARTED) + ($(CI_MINUTES) - $(SUITE_BUDGET_MARGIN_MIN)) * 60 )),0)

test: setup test-deps
	@echo "make test: set up in $$(( $$(date +%s) - $(TEST_STARTED) )) s"
	STACKD_SUITE_DEADLINE=$(SUITE_DEADLINE) STACKD_FUZZ_SECONDS=$(TEST_FUZZ_SECONDS) $(PY) -m pytest -m "not image and not cross and not aarch64_full" $(PYTEST_ARGS)
	STACKD_SUITE_DEADLINE=$(SUITE_DEADLINE) STACKD_PURE_PYTHON=1 $(PY) -m pytest $(FAST_SUITES) $(PYTEST_ARGS)
	@echo "make test: suites done at $$(( $$(date +%s) - $(TEST_STARTED) )) s"
	@$(MAKE) --no-print-directory test-image-stage TEST_STARTED=$(TEST_STARTED)

# Our kernels' aarch64 paths under qemu-aarch64, in full: the quick shapes `make test` runs and
# the full sweep (tests/kernels/test_aarch64.py; a few minutes under TCG); then `make wheels
# ARCH=aarch64` (cached) and its set checked, installed into an arm64 Debian root, the engine
# and a two-node tensor split run there under qemu (tests/image/test_aarch64_wheels.py); then
# `make image ARCH=aarch64` (cached) booted under qemu-system-aarch64 (tests/image/test_boot.py
# with STACKD_IMAGE_ARCH=aarch64). From nothing ~1 h on two cores (docs/testing.md).
test-aarch64: test-deps image-cross-deps
	$(PY) -m pytest tests/kernels/test_aarch64.py -m "aarch64 or aarch64_full" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory wheels ARCH=aarch64
	$(PY) -m pytest tests/image/test_aarch64_wheels.py -m "cross or aarch64_full" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory image ARCH=aarch64
	STACKD_IMAGE_ARCH=aarch64 $(PY) -m pytest tests/image/test_boot.py -m image $(PYTEST_ARGS)

test-image-stage:
	@if [ -z "$$CI" ]; then exec $(MAKE) --no-print-directory test-image; fi; \
	left=$$(( $(CI_MINUTES) * 60 - ($$(date +%s) - $(TEST_STARTED)) )); \
	if [ $$left -lt $(IMAGE_STAGE_MIN_SECONDS) ]; then \
	  echo "make test: the device image stage skipped, $$left s of CI's $(CI_MINUTES) min left"; exit 0; fi; \
	timeout -k 30 $$left $(MAKE) --no-print-directory test-image; status=$$?; \
	if [ $$status = 124 ] || [ $$status = 137 ]; then \
	  echo "make test: the device image stage cut at CI's $(CI_MINUTES) min"; exit 0; fi; exit $$status

# Each step timed, so that a CI log says where the stage's minutes went (docs/deploying.md,
# "CI's time").
# Debian's packages (network and dpkg, little CPU) are fetched beside the wheels' compile.
test-image: test-deps $(VENV)/.deps $(MINILM)
	@mkdir -p build/image; started=$$(date +%s); \
	  ( $(PY) packaging/image/build.py --base-only build/image > build/image/base.log 2>&1 || exit 1; \
	    echo "make test-image: Debian's packages in $$(( $$(date +%s) - started )) s (build/image/base.log)" ) & base=$$!; \
	  $(MAKE) --no-print-directory wheels; status=$$?; \
	  echo "make test-image: wheels in $$(( $$(date +%s) - started )) s"; \
	  wait $$base || { tail -20 build/image/base.log; exit 1; }; [ $$status = 0 ] || exit $$status
	@started=$$(date +%s); $(MAKE) --no-print-directory image || exit $$?; \
	  echo "make test-image: image in $$(( $$(date +%s) - started )) s"
	@started=$$(date +%s); $(PY) -m pytest tests/image -m "image or cross" $(PYTEST_ARGS); status=$$?; \
	  echo "make test-image: tests/image in $$(( $$(date +%s) - started )) s"; exit $$status

# Fuzzing on demand: the hypothesis targets of tests/fuzz for FUZZ_SECONDS in all, then the
# atheris targets (GGUF bytes, manifests, request JSON) for FUZZ_SECONDS / 3 each. A crash
# leaves its input in build/fuzz/crash-<target>-*.
fuzz: setup
	STACKD_FUZZ_SECONDS=$(FUZZ_SECONDS) $(PY) -m pytest tests/fuzz $(PYTEST_ARGS)
	for target in gguf manifest params dialects; do \
	  $(PY) -m tests.fuzz.atheris_targets $$target $$(( $(FUZZ_SECONDS) / 3 )) || exit 1; \
	done

# Mutation testing, on demand (not part of `make test`: it reruns the fast suites once per
# mutant). mutmut mutates a copy of server/ in mutants/; STACKD_PURE_PYTHON=1 makes the
# Cython-compiled modules load that copy's Python twins, not the .so built beside them.
MUTATE_TARGETS = $(shell $(PY) tests/mutation/targets.py)   # the one list: tests/mutation/targets.py
MUTATE_JOBS ?= 2

mutate: setup
	rm -rf mutants
	STACKD_PURE_PYTHON=1 $(VENV)/bin/mutmut run --max-children $(MUTATE_JOBS) $(MUTATE_TARGETS)
	$(PY) tests/mutation/score.py

bench: setup
	$(PY) bench/http_health.py

clean:
	rm -rf build mutants $(VENV) server/**/*.so server/*.so
	find server -name '*.c' -delete
