# Two set-up commands on a fresh clone: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test install lint bench clean

$(BIN)/tilec: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[pocl,test]"
	bash .ci/ensure-opencl $(BIN)/python
	touch $(BIN)/tilec

install: $(BIN)/tilec

run: install
	$(BIN)/tilec run examples/conv_relu.tile --validate

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check tilec tests

clean:
	rm -rf $(VENV) build *.egg-info
