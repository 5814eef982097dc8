# wsbook: `make book` builds the HTML book, `make test` runs every gate. Both set up .venv themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
# On a GPU server with its own CUDA torch: `make book TORCH=` skips the CPU wheel (see README).
TORCH ?= torch==2.13.0
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install book test unit chapters book-ci browser bench gpu-check lab clean browser-deps

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

# first every artifact of the results chapters, one worker process per core (one on a GPU), with a progress
# bar; then the build, whose chapters load them
book: install
	$(PY) -m wsbook all --jobs auto
	WSBOOK_PROGRESS=0 $(PY) -m wsbook.book . -W --keep-going
	@echo "open _build/html/index.html"

# the chapters gate first runs `python -m wsbook` for chapters 2, 5, 6 and 8-9; the chapters then execute once,
# in the book gate's build, with WSBOOK_CACHE_STRICT=align/,flows/,models/,posterior/,targets/,zoo/ (every
# cached function): an entry they would compute because the command line does not precompute it fails, as
# does a cell that raises
# (tests/gates.py; `make chapters` runs them under nbval)
test: install browser-deps
	CI=$${CI:-1} WSBOOK_SCALE=ci WSBOOK_STRICT_CHAPTERS=$${WSBOOK_STRICT_CHAPTERS:-1} $(PY) tests/gates.py

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

# the [bench] extra: the libraries the benchmarks compare against, installed with the torch already in
# .venv pinned (a peer that asks for a newer torch must not replace it). A torchvision that cannot load
# against this torch (PyPI's CUDA wheel next to a CPU torch) is removed: no benchmark needs it, and
# torchmetrics (imported by laplace-torch) only uses it when it loads.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[bench]" "torch==$$($(PY) -c 'import torch; print(torch.__version__.split("+")[0])')"
	@$(PY) -c "import torchvision" 2>/dev/null || { ! $(PY) -m pip show -q torchvision 2>/dev/null || \
	  { echo "removing a torchvision that does not load against this torch"; $(PY) -m pip uninstall -y -q torchvision; }; }
	@touch $(BENCH_STAMP)

# every benchmarks/bench_*.py, one after another; their lines, the machine and the date go to
# benchmarks/results.csv (rendered by the appendix "Performance"; commit it after a run on a quiet machine)
bench: $(BENCH_STAMP)
	$(PY) benchmarks/run_all.py

# on a CUDA machine (a few minutes): the CUDA tests, then a training step and a sampling pass of every field kind
# at `full` sizes in bfloat16 and float32 and a short MNIST flow run, written to benchmarks/gpu_results.csv
# (rendered by the appendix "Performance"); without a CUDA device it says so and exits 0
gpu-check: install
	WSBOOK_PROGRESS=0 $(PY) benchmarks/gpu_check.py

lab: install
	$(VENV)/bin/jupyter lab chapters $$([ "$$(id -u)" = 0 ] && echo --allow-root)

clean:
	rm -rf _build notebooks
