# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv when it is missing and installs what it needs from requirements.lock,
# the committed lock (`make lock` re-resolves it), so every machine gets the same versions.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LOCK := requirements.lock
# The lock is a constraint file (for the isolated build of attnkit too): each target
# installs only the extras it needs, at the locked versions.
INSTALL := PIP_CONSTRAINT=$(LOCK) $(PIP) install --progress-bar on
PIP_TOOLS := pip-tools==7.6.2

.PHONY: demo test lint bench lock notebooks test-compat clean browser

$(PY):
	@echo ">> creating $(VENV) with $$($(PYTHON) --version)"
	$(PYTHON) -m venv $(VENV)

# One stamp per extras set, so `make test` after `make demo` installs only what is new.
$(VENV)/.stamp-demo: pyproject.toml $(LOCK) | $(PY)
	@echo ">> installing attnkit with torch 2.13 (CPU build, ~200 MB download) and matplotlib"
	@echo ">> from $(LOCK) into $(VENV): about 1.1 GB on disk, 1-3 minutes"
	$(INSTALL) -e ".[torch,viz]"
	touch $@

$(VENV)/.stamp-test: pyproject.toml $(LOCK) requirements-nodeps.txt | $(PY)
	@echo ">> installing attnkit with every extra (torch, matplotlib, triton, transformers)"
	@echo ">> and the test tools from $(LOCK) into $(VENV): about 2 GB on disk, 2-5 minutes"
	$(INSTALL) -e ".[torch,viz,triton,transformers,dev]"
	$(PIP) install -q --no-deps --require-hashes -r requirements-nodeps.txt
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
	$(PY) -m pytest -q

lint: $(VENV)/.stamp-test
	$(PY) -m ruff check src tests benchmarks examples tools docs/learn

# The tutorial's notebooks (docs/learn/**/NN-*.ipynb), remade from the chapters by jupytext.
# Each is run in a kernel and stored with its outputs (a few minutes for all of them). Run it
# after editing a chapter and commit the notebooks (tests/learn checks they match).
notebooks: $(VENV)/.stamp-test
	$(PY) tools/notebooks.py

bench: $(VENV)/.stamp-test
	$(PY) -m attnkit bench --quick

# Re-resolve the lock to the newest releases that pyproject.toml and requirements.in allow.
# Run `make test` (and `make test-compat`) after it: that is what says the new set works.
lock: | $(PY)
	$(PIP) install -q "$(PIP_TOOLS)"
	$(PY) -m piptools compile --quiet --upgrade --allow-unsafe --strip-extras --no-emit-index-url \
		--no-emit-find-links --extra torch,viz,triton,transformers,dev \
		--output-file $(LOCK) pyproject.toml requirements.in

# The supported range: oldest and newest transformers, each in a venv of its own
# (.compat/), running tests/integrations and a smoke set of the rest; prints a table.
test-compat: | $(PY)
	$(PY) tools/compat.py

clean:
	rm -rf $(VENV) .compat attnkit-out .pytest_cache
