# Two set-up commands on a fresh clone: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test install oclgrind lint bench clean

$(BIN)/tilec: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[pocl,test,cluster]"
	bash .ci/ensure-opencl $(BIN)/python
	touch $(BIN)/tilec

install: $(BIN)/tilec

run: install
	$(BIN)/tilec run examples/conv_relu.tile --validate

# oclgrind in a venv of its own (tests/grind.py), for the bounded oclgrind subset the tests run;
# without it (no package index) those tests are skipped, as the warning says.
oclgrind: install
	@$(BIN)/python -c "from tests import grind; grind.install()" \
		|| echo "warning: oclgrind could not be installed; tests/runtime/test_oclgrind.py will be skipped"

test: install oclgrind
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check tilec tests

clean:
	rm -rf $(VENV) build *.egg-info
