# One place for set-up and checks; .ci/run calls `make check`, as the README says.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# PyTorch is installed first, pinned, so that nothing later pulls another build.
# On a CPU-only machine elsewhere, TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# avoids the CUDA packages.
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=

.PHONY: install demo test lint docs check sanitize clean

$(BIN)/asyncstream: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $@

# The native extension, rebuilt in place (where `pip install -e` put it) when its source
# changes after the install.
NATIVE := asyncstream/shards/_tarwalk.c asyncstream/shards/_records.c asyncstream/shards/_records.h
NATIVE += asyncstream/shards/_table.h asyncstream/shards/_member.c asyncstream/shards/_member.h
NATIVE += asyncstream/order/_drawc.c asyncstream/stream/_nextc.c asyncstream/stream/_soonest.c
NATIVE += asyncstream/stream/_soonest.h dali_ops/_batchc.c
NATIVE_SO := asyncstream/shards/.native-built
$(NATIVE_SO): $(BIN)/asyncstream $(NATIVE) setup.py
	$(BIN)/python setup.py --quiet build_ext --inplace
	touch $@

install: $(BIN)/asyncstream $(NATIVE_SO)

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

# Two pytest workers (pytest-xdist), a test module each at a time, the longest first
# (tests/conftest.py orders them; xdist alone would order them by their number of tests).
# The two cores are busy throughout (vmstat): three workers took 23:28 where two took
# 23:46 (2026-11-27), so two it is. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

check: lint test

# The native extension (asyncstream/shards/_tarwalk.c) under AddressSanitizer and
# UndefinedBehaviorSanitizer: built into a copy of the sources in build/sanitize (the
# normal build is left as it is), then the tar tests and the fuzzers comparing it with the
# Python reference run there, a bounded number of examples each (derandomized: the same
# inputs every time). Python itself is not instrumented: libasan is preloaded, Python
# allocates with malloc (PYTHONMALLOC=malloc: a small range held in pymalloc's arenas would
# hide a read past its end) and leak detection is off (the interpreter keeps its objects at
# exit by design). Any report ends the run with an error. CI runs it after `make check`.
SANITIZE_DIR := build/sanitize
SANITIZE_TESTS ?= tests/test_native_tar.py tests/test_tarfast.py tests/test_tar.py tests/test_native_draw.py \
	tests/test_native_batch.py tests/test_native_next.py tests/test_prefetch.py
SANITIZE_EXAMPLES ?= 100
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1
sanitize: install
	rm -rf $(SANITIZE_DIR)
	mkdir -p $(SANITIZE_DIR)
	cp -r asyncstream dali_ops tests setup.py pyproject.toml README.md $(SANITIZE_DIR)/
	cd $(SANITIZE_DIR) && CFLAGS="$(SANITIZE_FLAGS)" LDFLAGS="$(SANITIZE_FLAGS)" \
		$(abspath $(BIN))/python setup.py --quiet build_ext --inplace --force
	cd $(SANITIZE_DIR) && LD_PRELOAD="$$(gcc -print-file-name=libasan.so)" \
		PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
		UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		ASYNCSTREAM_FUZZ_EXAMPLES=$(SANITIZE_EXAMPLES) PYTHONPATH=$(abspath $(SANITIZE_DIR)) \
		timeout 900 $(abspath $(BIN))/python -m pytest -p no:cacheprovider -q \
		-n $(PYTEST_WORKERS) --dist loadfile $(SANITIZE_TESTS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info site build asyncstream/*/*.so dali_ops/*.so $(NATIVE_SO)
