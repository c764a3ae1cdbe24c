# Two commands for a new user: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install constraints demo test bench bench-quick fixtures stress lint typecheck clean

install: $(STAMP)

PYOK := import sys; sys.exit(sys.version_info < (3, 11))

$(STAMP): pyproject.toml constraints.txt setup.py agentrt/_jsonlpage.c agentrt/_eventrows.c
	@$(BIN)/python -c '$(PYOK)' 2>/dev/null || { \
	  test -n "$(PYTHON)" && $(PYTHON) -c '$(PYOK)' || { \
	    echo "make: agentrt needs Python 3.11 or newer; found: $$($(PYTHON) -V 2>&1 || echo none). Install python3.11, or pass PYTHON=/path/to/python3.11" >&2; exit 1; }; \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --upgrade -c constraints.txt pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# Resolve pyproject.toml's ranges afresh and pin what they give (see constraints.txt).
PINS := .venv-pins
constraints:
	rm -rf $(PINS) && $(PYTHON) -m venv $(PINS)
	$(PINS)/bin/python -m pip install --quiet --upgrade pip
	$(PINS)/bin/python -m pip install --quiet -e '.[dev]'
	{ grep '^#' constraints.txt; \
	  $(PINS)/bin/python -m pip freeze --all --exclude-editable --exclude setuptools; \
	} > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(PINS)

demo: install
	$(BIN)/python -m agentrt.demo demo.db

# Two workers (the CI machine has two cores; most of a test's time is spent
# waiting on a child process, a disk sync or a socket). A module's tests stay in
# one worker, so its module-scoped receivers and databases are made once.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

stress: install
	AGENTRT_STRESS=1 $(BIN)/python -m pytest -q -m slow

bench: install
	$(BIN)/python -m bench

bench-quick: install
	$(BIN)/python -m bench --quick

fixtures: install
	$(BIN)/python -m fixtures.generate fixtures

lint: install
	$(BIN)/ruff check agentrt agentrt_export agentrt_otel tests bench fixtures

typecheck: install
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(PINS) .pytest_cache .mypy_cache .ruff_cache *.egg-info demo.db* agentrt/_jsonlpage.*.so agentrt/_eventrows.*.so build
