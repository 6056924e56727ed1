# The README's commands. Every target creates .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: demo test lint typecheck unit bench clean chromium kernel lab wrk vendor-plotly

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

# Two processes (pytest-xdist): many tests wait on servers, kernels and browsers, so two fit two
# cores; each test module runs in one of them (tests/_parallel.py). Serially: `.venv/bin/pytest`.
unit: $(STAMP) chromium kernel
	$(BIN)/pytest -n 2

test: chromium kernel lint typecheck unit

# The proxy benchmark's load generator at 64 clients is Debian's wrk (a C program).
wrk:
	command -v wrk > /dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk)

bench: $(STAMP) wrk
	$(BIN)/python -m benchmarks

# The live dashboard's light plotly.js (ngcapture_viz/display/bundles.py): npm's basic bundle of
# the version the installed plotly ships. Maintainers only; needs npm and the network.
vendor-plotly: $(STAMP)
	version=$$($(BIN)/python -c "from plotly.offline import get_plotlyjs; \
	from ngcapture_viz.display.bundles import plotlyjs_version; \
	print('.'.join(map(str, plotlyjs_version(get_plotlyjs()))))") && \
	work=$$(mktemp -d) && (cd $$work && npm pack --silent plotly.js-basic-dist-min@$$version && \
	tar xzf plotly.js-basic-dist-min-$$version.tgz) && \
	cp $$work/package/plotly-basic.min.js ngcapture_viz/display/assets/plotly-basic.min.js && \
	cp $$work/package/LICENSE ngcapture_viz/display/assets/plotly.js-LICENSE && rm -rf $$work

clean:
	rm -rf $(VENV) results .mypy_cache .ruff_cache .pytest_cache .hypothesis
