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
	@echo "make test     set up .venv and run the test suite (PYTEST_ARGS='-m gpu' to pick tests)"
	@echo "make lint     ruff over the project"
	@echo "make wheelhouse  download every wheel needed into wheelhouse/ for offline installs"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "NBody Live needs Python >= 3.11; set PYTHON=python3.11 or newer")'
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,mpi]'
	$(BIN)/python -m app.core.setup_cuda
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/nbody-live run $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check app tests

wheelhouse:
	$(PYTHON) -m pip download --disable-pip-version-check -d wheelhouse setuptools wheel '.[test,mpi]'
	@rm -f wheelhouse/nbody_live-*

clean:
	rm -rf $(VENV) out .pytest_cache
