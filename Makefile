# The README's commands. Every target creates .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: demo test lint typecheck unit bench clean chromium kernel lab wrk

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,pandas,notebook]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m capture_core.demo --out results/demo

# The browser test drives Debian's chromium (never playwright's own browser downloads).
chromium:
	test -x $(CHROMIUM) || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium)

# The notebook tests run a real Jupyter kernel: register the venv's interpreter as `python3`.
kernel: $(STAMP)
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 > /dev/null

# JupyterLab on the notebooks (127.0.0.1 only); the first notebook cell makes the demo data.
lab: $(STAMP) kernel
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) chromium kernel
	$(BIN)/pytest

test: chromium kernel lint typecheck unit

# The proxy benchmark's load generator at 64 clients is Debian's wrk (a C program).
wrk:
	command -v wrk > /dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk)

bench: $(STAMP) wrk
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) results .mypy_cache .ruff_cache .pytest_cache .hypothesis
