# NBody Live: `make run` and `make test` set everything up themselves.
#
# Offline (a machine with no network, e.g. a lent GPU box): build a wheel folder once where there is a
# network with `make wheelhouse`, copy it over, then
#     PIP_FIND_LINKS=$PWD/wheelhouse PIP_NO_INDEX=1 make test
# pip reads both variables itself, so every install step below honours them.

PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
ARGS ?=
PYTEST_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.nbody-live-installed

.PHONY: run test lint bench wheelhouse clean help

help:
	@echo "make run      set up .venv and open the viewer (ARGS='collision --n 32768' to pass options)"
	@echo "make test     set up .venv, run make lint, then the test suite (PYTEST_ARGS='-m gpu' to pick tests)"
	@echo "make lint     ruff check, ruff format --check and mypy (app/); ruff format app tests bench fixes the format"
	@echo "make wheelhouse  download every wheel needed into wheelhouse/ for offline installs"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "NBody Live needs Python >= 3.11; set PYTHON=python3.11 or newer")'
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,mpi]'
	$(BIN)/python -m app.core.setup_cuda
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/nbody-live run $(ARGS)

# CI runs exactly `make test` (.ci/run), so the lint runs there too, first: a format slip or a type error
# fails in seconds, before the suite's minutes.
test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check app tests bench
	$(BIN)/ruff format --check app tests bench
	$(BIN)/mypy

wheelhouse:
	$(PYTHON) -m pip download --disable-pip-version-check -d wheelhouse setuptools wheel '.[test,mpi]'
	@rm -f wheelhouse/nbody_live-*

clean:
	rm -rf $(VENV) out .pytest_cache
