# The two commands: `make demo` runs the main job, `make test` runs the whole suite.
# Both start with `make setup`, so each works alone on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
PYTEST_ARGS ?=
# the suite's workers (pytest-xdist): one per core and one more, at most four, a test module to a worker
# (its module fixtures are built once); each worker starts the session's services it needs. The extra
# worker: about a third of the suite waits (on Airflow's schedulers, on windows of real samples), and
# two workers on two cores kept them busy 70 % of the time. WORKERS=0: one process.
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
XDIST = $(if $(filter 0,$(WORKERS)),-p no:xdist,-n $(WORKERS) --maxprocesses 4 --dist loadfile)
# how far test-clock-ahead moves the clock (faketime offset: +7d, +30d, +1y)
SHIFT ?= +30d

.PHONY: setup system-deps demo test test-unit test-quick test-clock-ahead lint bench clean

# The project's modules compiled at each setup (only what changed): Python reads .pyc even where
# PYTHONDONTWRITEBYTECODE keeps it from writing them, and without them every process (a CLI command,
# an Airflow task, a test's subprocess) compiles each module it imports again. The locked packages are
# compiled once, when they are installed (uv's --compile-bytecode, as pip does by default).
setup: $(STAMP)
	@$(BIN)/python -m compileall -q plugins dags bench tests

# requirements-dev.lock: the runtime lock (requirements.lock, what the image installs) plus tests,
# linters and the docs site; both carry hashes, and installs check them (--require-hashes).
$(STAMP): requirements-dev.lock requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@test -x $(BIN)/uv || { awk '/^uv==/{p=1} p&&/^[a-z]/&&!/^uv==/{p=0} p' requirements-dev.lock > $(VENV)/uv.lock.txt \
		&& $(BIN)/pip install -q --require-hashes --no-deps -r $(VENV)/uv.lock.txt; }
	$(BIN)/uv pip sync -q --compile-bytecode --require-hashes --python $(BIN)/python requirements-dev.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

# Debian packages the integration tests start for real (Slurm, Prometheus, PostgreSQL, sshd, Chromium...).
# Installs only what is missing, and only when run as root; otherwise those tests skip with a reason.
system-deps:
	@bash scripts/install-system-deps.sh

demo: setup
	$(BIN)/gpu-cost demo

test: setup system-deps
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/python -m pytest $(XDIST) tests/unit tests/dags $(PYTEST_ARGS)

# the quick subset: no service started, nothing marked slow (about a minute)
test-quick: setup
	$(BIN)/python -m pytest -m "not slow and not integration and not e2e" $(PYTEST_ARGS)

# the suite with the clock moved ahead (finds tests that depend on today's date); what it leaves out and why:
# scripts/test-clock-ahead.sh
test-clock-ahead: setup system-deps
	bash scripts/test-clock-ahead.sh $(SHIFT) $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check plugins dags tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: setup
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .demo .gpu_cost

# the documentation site (MkDocs, Material theme) into ./site; --strict fails on a broken link or a page
# missing from the nav. The generated references: .venv/bin/python -m gpu_cost.cli.docgen (docs/development.md)
.PHONY: docs report-picture
docs: setup
	$(BIN)/mkdocs build --strict -d site

# docs/sample-weekly-report.png: the demo's newest weekly report, the whole page, in headless Chromium
report-picture: demo
	$(BIN)/python scripts/report-screenshot.py
