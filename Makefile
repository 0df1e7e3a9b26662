# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing and installs what it needs from requirements.lock,
# the committed lock (`make lock` re-resolves it), so every machine gets the same versions.
# The lock serves Linux, macOS and Windows on Python 3.10-3.13 (environment markers pick
# the lines of each); it pins torch's public version, and tools/torch_build.py chooses
# where the build comes from (CPU index, CUDA from PyPI, macOS) and says why.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LOCK := requirements.lock
# The lock is a constraint file (for the isolated build of attnkit too): each target
# installs only the extras it needs, at the locked versions.
INSTALL := PIP_CONSTRAINT=$(LOCK) $(PIP) install --progress-bar on
# One shell line: the pip arguments of the torch build (an extra index, or a requirement),
# printed with the reason by tools/torch_build.py; TORCH=cpu|cuda|pypi overrides.
TORCH_ARGS := args="$$($(PY) tools/torch_build.py --lock $(LOCK))"
SHOW_TORCH := $(PY) tools/torch_build.py --installed
UV := uv==0.13.9
# `make test`: pytest on every core (an idle worker takes tests queued for a busy one), and
# the slowest tests listed at the end.
PYTEST_ARGS ?= -n auto --dist worksteal --durations=15

.PHONY: demo test lint bench lock notebooks test-compat test-platforms test-models clean browser

$(PY):
	@echo ">> creating $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)

# One stamp per extras set, so `make test` after `make demo` installs only what is new.
$(VENV)/.stamp-demo: pyproject.toml $(LOCK) | $(PY)
	@echo ">> installing attnkit with torch 2.13 and matplotlib from $(LOCK) into $(VENV)"
	@$(TORCH_ARGS) && set -x && $(INSTALL) $$args -e ".[torch,viz]"
	@$(SHOW_TORCH)
	touch $@

$(VENV)/.stamp-test: pyproject.toml $(LOCK) requirements-nodeps.txt | $(PY)
	@echo ">> installing attnkit with every extra (torch, matplotlib, triton on Linux,"
	@echo ">> transformers) and the test tools from $(LOCK) into $(VENV): 2-5 minutes"
	@$(TORCH_ARGS) && set -x && $(INSTALL) $$args -e ".[torch,viz,triton,transformers,dev]"
	$(PIP) install -q --no-deps --require-hashes -r requirements-nodeps.txt
	@$(SHOW_TORCH)
	touch $@

# The explorer's browser tests drive Debian's chromium (Playwright comes with the dev
# extra; its own browser download cannot be used here). CI runs as root with no stdin.
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null || (echo ">> installing Debian's chromium for the browser tests" && \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium)

demo: $(VENV)/.stamp-demo
	$(PY) -m attnkit demo --out attnkit-out
	$(PY) -m attnkit train --out attnkit-out

test: $(VENV)/.stamp-test browser
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check src tests benchmarks examples tools docs/learn

# The tutorial's notebooks (docs/learn/**/NN-*.ipynb), remade from the chapters by jupytext.
# Each is run in a kernel and stored with its outputs (a few minutes for all of them). Run it
# after editing a chapter and commit the notebooks (tests/learn checks they match).
notebooks: $(VENV)/.stamp-test
	$(PY) tools/notebooks.py

bench: $(VENV)/.stamp-test
	$(PY) -m attnkit bench --quick

# Re-resolve the lock to the newest releases that pyproject.toml and requirements.in allow,
# for every platform and Python 3.10+ at once (uv's universal resolution: one file whose
# environment markers fork where a platform or Python needs other versions), then check that
# every row of the platform matrix resolves. Run `make test` (and `make test-compat`) after
# it: that is what says the new set works. A new torch pin goes into LOCKED_TORCH in
# src/attnkit/torch_build.py too (what the notebooks ask for outside a clone; a test checks).
lock: | $(PY)
	$(PIP) install -q "$(UV)"
	$(VENV)/bin/uv pip compile --universal --python-version 3.10 --upgrade --quiet \
		--extra torch --extra viz --extra triton --extra transformers --extra dev \
		--custom-compile-command "make lock" --output-file $(LOCK) pyproject.toml requirements.in
	$(MAKE) test-platforms

# Resolves what the README's commands install for each platform x Python 3.10-3.13 (Linux
# CPU and CUDA, macOS arm64, Windows) against the package index, without installing
# anything, and prints a table; exits 1 when a row does not resolve. PLATFORM_ARGS passes
# options on, e.g. PLATFORM_ARGS="--cpu-index DIR" for a local folder standing in for
# PyTorch's CPU index.
test-platforms: | $(PY)
	$(PIP) install -q "$(UV)"
	$(PY) tools/platforms.py --uv $(VENV)/bin/uv $(PLATFORM_ARGS)

# The supported range: oldest and newest transformers, each in a venv of its own
# (.compat/), running tests/integrations and a smoke set of the rest; prints a table.
test-compat: | $(PY)
	$(PY) tools/compat.py

# `attnkit check model` on ~50 architectures x float32/bfloat16/float16 x left/right/no
# padding (eager, sdpa, attnkit; two decoding steps): prints the table, fails on any error.
test-models: $(VENV)/.stamp-test
	$(PY) tools/check_models.py

clean:
	rm -rf $(VENV) .compat attnkit-out .pytest_cache
