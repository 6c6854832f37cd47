# Everything runs from a venv inside the repo; `make test` and `make demo` set it up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup setup-launchers setup-frameworks slurm-up slurm-down demo test test-scenarios fuzz lint typecheck docs census \
	bench bench-run clean scoreboard browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[torch,dev,stacks]'
	touch $(STAMP)

setup: $(STAMP)

# accelerate and deepspeed for tests/test_run_launchers.py, torch kept at 2.13.0 by the
# constraints; DeepSpeed's CPU backend compiles its shm op on first use (about 1-2 min here):
# done once now, into this venv's own extension cache (tests/conftest.py points the tests
# there), instead of inside a test.
LAUNCHERS_STAMP := $(VENV)/.launchers
$(LAUNCHERS_STAMP): $(STAMP) constraints.txt
	@# a failure here leaves those tests skipped (they say why), not the whole suite failed;
	@# a build interrupted earlier left a lock that would make this one wait for ever, so
	@# the op is built afresh (the stamp is missing: nothing built here is complete)
	rm -rf $(abspath $(VENV))/torch_extensions
	$(BIN)/pip install -q -c constraints.txt -e '.[torch,dev,stacks,launchers]' \
		&& TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions \
			timeout 1200 $(BIN)/python -c "$$DS_WARM_OP" \
		&& touch $(LAUNCHERS_STAMP) \
		|| echo "setup-launchers failed: the accelerate/deepspeed tests will be skipped" >&2

export DS_WARM_OP := from deepspeed.accelerator import get_accelerator as a; b = a().create_op_builder("ShareMemCommBuilder"); b is None or b.load()

setup-launchers: $(LAUNCHERS_STAMP)

# accelerate, lightning and transformers for the framework scenarios (scenarios/frameworks.py,
# tests/test_frameworks_real.py), torch kept at 2.13.0 by the constraints.
FRAMEWORKS_STAMP := $(VENV)/.frameworks
$(FRAMEWORKS_STAMP): $(STAMP) constraints.txt
	@# a failure here leaves those tests skipped (they say why), not the whole suite failed
	$(BIN)/pip install -q -c constraints.txt -e '.[torch,dev,stacks,frameworks]' \
		&& touch $(FRAMEWORKS_STAMP) \
		|| echo "setup-frameworks failed: the framework scenario runs will be skipped" >&2

setup-frameworks: $(FRAMEWORKS_STAMP)

# a single-node Slurm for tests/test_slurm.py (CI's .ci/run does this around `make test`)
slurm-up:
	bash .ci/slurm-up

slurm-down:
	bash .ci/slurm-down

demo: $(STAMP)
	$(BIN)/ddpdoctor demo

LINT_DIRS := $(wildcard src tests benchmarks corpus census)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two workers: the tests that start real jobs run one at a time on one of them (tests/conftest.py,
# JOB_MARKERS) while the other diagnoses logs (12.4 minutes on one worker, 7.5 on two here).
test: $(STAMP) $(LAUNCHERS_STAMP) $(FRAMEWORKS_STAMP) lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25

# All 45 scenarios for real (about 6 min); `make test` runs the core 13 and diagnoses the
# recorded output of every one. CI (.ci/run) runs this after `make test`.
test-scenarios: $(STAMP) $(LAUNCHERS_STAMP) $(FRAMEWORKS_STAMP)
	$(BIN)/python -m pytest -q --all-scenarios tests/test_scenarios_real.py tests/test_run_launchers.py

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

# Thousands of hostile inputs (mutated real logs, run folders, error files, special files) with
# fresh randomness, and the linear-time check with more pumping characters; `make test` runs a
# few hundred derandomized ones. Two of these tests walk thousands of cases or the whole regex
# inventory on 1 MB lines (4.6 min for the probe alone here, over 5 on CI's machine; 6.5 min for
# the mutated real logs there), so the per-test limit is 30 min, not pyproject's 5; a stalled
# regex is still stopped after 60 s by the probe's own watch. Also every secret format through
# every report format (tests/test_redaction_cli.py; `make test` runs a third of them), and the
# checks over every real capture and real line: the order-invariance test of every capture, the
# prefilters' and redaction hints' agreement on every real line, 60 dense-scan cases (`make test`
# runs a stable third of the captures and lines, 20 dense cases: tests/conftest.py tier_sample),
# and a stable third there of these over every real input: the JSON schema of each report, the
# run router's routing of each prefixed console, the cut-traceback reading of each console.
fuzz: $(STAMP)
	DDPDOCTOR_FUZZ=full $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 1800 \
		tests/test_fuzz.py tests/test_linear_time.py tests/test_redaction_cli.py \
		tests/test_order_invariance.py tests/test_dense_scan.py tests/test_prefilters.py \
		tests/test_suffix_safe.py tests/test_redaction.py tests/test_unwrap.py \
		tests/test_metamorphic.py tests/test_report_schema.py tests/test_run_lines.py \
		tests/test_cut_traceback.py --hypothesis-show-statistics

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
