# Everything runs from a venv inside the repo; `make test` and `make demo` set it up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test fuzz lint typecheck docs census bench bench-run clean scoreboard

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[torch,dev,stacks]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/ddpdoctor demo

LINT_DIRS := $(wildcard src tests benchmarks corpus census)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy
	$(BIN)/lint-imports

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

# Thousands of hostile inputs (mutated real logs, run folders, error files, special files) with
# fresh randomness, and the linear-time check with more pumping characters; `make test` runs a
# few hundred derandomized ones.
fuzz: $(STAMP)
	DDPDOCTOR_FUZZ=full $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_fuzz.py tests/test_linear_time.py --hypothesis-show-statistics

docs: $(STAMP)
	$(BIN)/ddpdoctor rules --write-docs docs/rules

# the coverage page of the census of upstream messages (census/messages.jsonl)
census: $(STAMP)
	$(BIN)/python census/coverage.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# What `ddpdoctor run` costs a job writing 200 MB (bare vs supervised, same run); ~15 min.
bench-run: $(STAMP)
	$(BIN)/python benchmarks/run_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

scoreboard: $(STAMP)
	$(BIN)/python corpus/scoreboard.py --markdown docs/scoreboard.md
