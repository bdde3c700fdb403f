# One place for set-up and checks; .ci/run calls `make check`, as the README says.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# PyTorch is installed first, pinned, so that nothing later pulls another build.
# On a CPU-only machine elsewhere, TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# avoids the CUDA packages.
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=

.PHONY: install demo test lint docs check clean

$(BIN)/asyncstream: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $@

install: $(BIN)/asyncstream

demo: install
	$(BIN)/asyncstream demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(MAKE) docs

# The documentation site (docs/, mkdocs.yml) into site/, warnings as errors: a broken
# link, a page left out of the navigation or a docstring that does not parse fails.
docs: install
	$(BIN)/mkdocs build --strict --quiet

# Two pytest workers (pytest-xdist), a test module each at a time: most tests wait on
# servers and child processes, so two workers on two cores take about 12 minutes where one
# takes 22. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

check: lint test

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info site
