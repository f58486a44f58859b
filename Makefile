# The two commands of the README. Each installs what it needs into .venv (uv, with its cache under
# ~/.cache/uv) and builds the local control plane into ~/.cache/asyncgrpo (cached by version).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
UV     := $(PYTHON) -m uv
PYTEST_ARGS ?=

.PHONY: venv demo test lint typecheck generated unit e2e

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m uv --version >/dev/null 2>&1 || $(PYTHON) -m pip install -q --disable-pip-version-check uv
	[ -x $(PY) ] || $(UV) venv -q --python $(PYTHON) $(VENV)
	$(UV) pip install -q --python $(PY) -e '.[dev]'
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
