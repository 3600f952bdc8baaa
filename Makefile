# infersight: two set-up commands, `make demo` and `make test`, work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build by default; GPU users override, e.g. `make demo TORCH_SPEC="torch --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv install install-test demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: venv
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e .

install-test: install
	$(PY) -m pip install -q -e ".[test]"

demo: install
	$(PY) -m infersight demo

test: install-test
	$(PY) -m pytest

bench: install
	$(PY) -m infersight bench runtime

clean:
	rm -rf $(VENV) build *.egg-info
