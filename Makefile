# The two set-up commands of the README: `make test` (tests) and, later, the main training job.
# Each creates .venv with a pinned torch (+ torchvision, which ComfyUI needs) when it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1

.PHONY: venv test lint
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -r requirements.txt -e ".[test]"
	touch $@

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: venv
	$(PY) -m ruff check .
