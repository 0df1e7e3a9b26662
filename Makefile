# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing and installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Development pin: a CPU build of this version is served here; an unpinned
# torch would pull gigabytes of CUDA packages.
TORCH_PIN := torch==2.13.0

.PHONY: demo test lint bench clean browser

$(PY):
	$(PYTHON) -m venv $(VENV)

# One stamp per extras set, so `make test` after `make demo` installs only what is new.
$(VENV)/.stamp-demo: pyproject.toml | $(PY)
	$(PIP) install -q "$(TORCH_PIN)" -e ".[torch,viz]"
	touch $@

$(VENV)/.stamp-test: pyproject.toml | $(PY)
	$(PIP) install -q "$(TORCH_PIN)" -e ".[torch,viz,triton,transformers,dev]"
	touch $@

# The explorer's browser tests drive Debian's chromium (Playwright comes with the dev
# extra; its own browser download cannot be used here). CI runs as root with no stdin.
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
browser:
	command -v chromium >/dev/null || ($(SUDO) apt-get update && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y chromium)

demo: $(VENV)/.stamp-demo
	$(PY) -m attnkit demo --out attnkit-out
	$(PY) -m attnkit train --out attnkit-out

test: $(VENV)/.stamp-test browser
	$(PY) -m pytest -q

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check src tests benchmarks examples

bench: $(VENV)/.stamp-test
	$(PY) -m attnkit bench --quick

clean:
	rm -rf $(VENV) attnkit-out .pytest_cache
