# `make test` and `make reproduce` work on a fresh clone: they create .venv and install what they need.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ONLY ?=
PRESET ?= quick

.PHONY: install test test-all reproduce report clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# The suite that CI runs: everything but tests marked `slow`, on 2 workers.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q --durations=15 -m "not slow" --nbmake --nbmake-timeout=300

test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q --durations=15 --nbmake --nbmake-timeout=300

# Runs the quick preset of every experiment (or PRESET=long, ONLY=<slug>[,<slug>]), rebuilds
# results/REPORT.md and the README table from results/*.json, and prints a table of what ran.
reproduce: $(STAMP)
	$(BIN)/python -m experiments.report --run --preset=$(PRESET) $(if $(ONLY),--only=$(ONLY))

report: $(STAMP)
	$(BIN)/python -m experiments.report

clean:
	rm -rf $(VENV) workdirs .pytest_cache
