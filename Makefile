# infersight: two set-up commands, `make demo` and `make test`, work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build by default; GPU users override, e.g. `make demo TORCH_SPEC="torch --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv install install-test services demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: venv
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e .

install-test: install services
	$(PY) -m pip install -q -e ".[test]"

# Services the tests start themselves: a real Prometheus server (Debian's package, which also
# brings promtool) and Chromium (the report's browser tests). Installed only when missing; the
# tests skip, saying why, if they cannot be.
services:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) >/dev/null 2>&1 \
	    || sudo -n sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus' >/dev/null 2>&1 \
	    || echo "warning: could not install prometheus; the Prometheus tests will be skipped" )
	@test -x /usr/bin/chromium || \
	  ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation) >/dev/null 2>&1 \
	    || sudo -n sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation' >/dev/null 2>&1 \
	    || echo "warning: could not install chromium; the report's browser tests will be skipped" )

demo: install
	$(PY) -m infersight demo

test: install-test
	$(PY) -m pytest

bench: install
	$(PY) -m infersight bench runtime

clean:
	rm -rf $(VENV) build *.egg-info
