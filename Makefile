# wsbook: `make book` builds the HTML book, `make test` runs every gate. Both set up .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a GPU server with its own CUDA torch: `make book TORCH=` skips the CPU wheel (see README).
TORCH ?= torch==2.13.0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install book test unit chapters book-ci browser bench lab clean browser-deps

install: $(STAMP)

$(STAMP): pyproject.toml book/jupyterlab-overrides.json
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(TORCH)" ] && ! $(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH)'.split('==')[-1])" 2>/dev/null; then \
	  echo "installing $(TORCH) first"; $(PY) -m pip install -q "$(TORCH)"; fi
	$(PY) -m pip install -q -e ".[dev]"
	@# JupyterLab in this environment opens the chapters (.md) as notebooks through jupytext
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp book/jupyterlab-overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	@touch $(STAMP)

book: install
	WSBOOK_PROGRESS=0 $(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "open _build/html/index.html"

test: install browser-deps
	CI=$${CI:-1} WSBOOK_SCALE=ci $(PY) tests/gates.py

unit: install
	WSBOOK_SCALE=ci $(PY) tests/gates.py unit

chapters: install
	WSBOOK_SCALE=ci $(PY) tests/gates.py chapters

book-ci: install
	WSBOOK_SCALE=ci $(PY) tests/gates.py book

browser: install browser-deps
	WSBOOK_SCALE=ci $(PY) tests/gates.py browser

browser-deps:
	@command -v chromium >/dev/null || { echo "installing Debian chromium for the browser gate"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
	  || sudo sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null'; }

bench: install
	@for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

lab: install
	$(VENV)/bin/jupyter lab chapters

clean:
	rm -rf _build notebooks
