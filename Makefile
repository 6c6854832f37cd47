# Everything runs from a venv inside the repo; `make test` and `make demo` set it up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck docs bench clean browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[torch,dev,stacks]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/ddpdoctor demo

LINT_DIRS := $(wildcard src tests benchmarks)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

# The timeline's browser test (tests/test_timeline_browser.py) needs Debian's chromium and its
# driver: about 120 MB to download and 500 MB installed, so not part of `make test` (the test
# skips, saying why, without them). CI (.ci/run) installs them first. Root or sudo needed.
SUDO := $(shell [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null && echo sudo)
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		echo "chromium and chromedriver are installed"; \
	else \
		$(SUDO) apt-get install -y --no-install-recommends chromium chromium-driver \
		|| { $(SUDO) apt-get update && \
		     $(SUDO) apt-get install -y --no-install-recommends chromium chromium-driver; }; \
	fi

docs: $(STAMP)
	$(BIN)/ddpdoctor rules --write-docs docs/rules

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
