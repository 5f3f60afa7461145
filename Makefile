# grouprl: two commands for a newcomer -- `make run` and `make test`.
# Both create or refresh .venv idempotently: a second call installs nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.grouprl-installed
BENCH_STAMP := $(VENV)/.grouprl-bench-installed
RECIPE ?= recipes/default.yaml
PYTEST_ARGS ?= -n 2

.PHONY: setup run test test-all lint bench bench-all check-docs curves clean sandbox-deps browser-deps

setup: $(STAMP) sandbox-deps

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test]"
	@touch $(STAMP)

# bubblewrap gives the code sandbox a network namespace and a read-only filesystem.
# Installed where we run as root; elsewhere `grouprl sandbox check` says what is missing.
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "grouprl: installing bubblewrap with apt-get (root, bwrap missing; for the strict code sandbox)"; \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) || \
	    echo "note: could not install bubblewrap; strict sandbox isolation is unavailable (see grouprl sandbox check)"; \
	  else echo "note: bubblewrap not found; run 'grouprl sandbox check' for how to install it"; fi; }

# One torch thread by default: the tiny built-in model gains nothing from more, and a fixed count keeps
# runs repeatable (override: make run OMP_NUM_THREADS=2).
OMP_NUM_THREADS ?= 1
run: setup
	OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(BIN)/grouprl train -c $(RECIPE)

# Headless Chromium lets the tests open the run report as a person would (tests/report/test_report_browser.py).
# Installed for the tests only, where we run as root; elsewhere those tests skip and say why.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium with apt-get (headless browser for the report tests)"; \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) || \
	    echo "note: could not install chromium; the browser tests of the run report will be skipped"; \
	  else echo "note: chromium not found; the browser tests of the run report will be skipped"; fi; }

test: setup browser-deps
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) -m "not slow"

test-all: setup browser-deps
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check src tests benchmarks

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test,bench]"
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/vs_trl.py

# grouprl vs TRL on the three model presets (tiny, small, medium), GRPO and GSPO, with the plain-PyTorch floor
# of each phase; prints the three-size table (benchmarks/README.md says how long it takes). Phases are timed
# by each child's CPU time (one torch thread: the same work, steadier on a shared machine).
# Pass grouprl config switches with BENCH_ARGS='--grouprl-opt key=value'.
BENCH_ARGS ?=
bench-all: $(BENCH_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/vs_trl.py --size all --clock cpu --repeats 3 --floor-repeats 2 \
		--out benchmarks/results/vs_trl_sizes.json $(BENCH_ARGS) > /dev/null

# Re-measure every learning figure the README, the recipe headers and docs/ quote (3 seeds each, one torch
# thread per run, outputs in runs/check-docs/) and compare it with the quoted range; prints JSON, exit 1 when
# a figure is outside its range. CHECK_DOCS_ARGS='--only default --seeds 0' re-checks a part.
CHECK_DOCS_ARGS ?= --jobs 2
check-docs: setup
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/check_docs.py $(CHECK_DOCS_ARGS)

# Every recipe's learning curve (agent_calculator, code_repair, retrieval, guess_number, reasoning_gym), JSON + PNG
# in benchmarks/results/, one after another, one torch thread each (hours on 2 cores); prints one JSON summary.
# CURVES_ARGS='--only retrieval --reuse' runs a part and keeps finished cells; '--dry-run' lists the commands.
CURVES_ARGS ?=
curves: setup
	OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(BIN)/python benchmarks/curves.py $(CURVES_ARGS)

# .cache/grouprl-test is the test suite's cache of built models (tests/conftest.py); clean removes it too
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis runs outputs .cache/grouprl-test
