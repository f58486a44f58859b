# The asyncgrpo trainer: CUDA, Ray, vLLM, Megatron-core and asyncgrpo's `gpu` extra.
#   docker build -f images/trainer.Dockerfile -t ghcr.io/asyncgrpo/trainer:0.1.0 .
# KubeRay runs this image for the head and every worker: it replaces the command with `ray start`
# (so there is no ENTRYPOINT to get in its way), and the operator starts the driver on the head
# with the command below (`python -m asyncgrpo_trainer --job-spec /etc/asyncgrpo/job.json`).

# CUDA 13.0: the torch the `gpu` extra pins (torch==2.11.0, whose PyPI wheel is built for CUDA 13.0,
# `+cu130`) and vLLM 0.26 built against it; tests/chart/test_images.py checks the two agree.
ARG BASE_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}
# gpu: the image above. cpu: the image the tests run on a CPU node (`python -m tests.cluster
# images` builds it on a Debian base, as ghcr.io/asyncgrpo/trainer:<version>-cpu): the `trainer`
# extra, no vLLM or Megatron, and torch without what only its GPU code loads (see below).
ARG VARIANT=gpu

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# wget: KubeRay's readiness/liveness probes exec it; git and a compiler: vLLM/Megatron extensions.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev build-essential git wget ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv "$VIRTUAL_ENV"

WORKDIR /src
COPY pyproject.toml ./
# cpu: torch's only Linux wheel on PyPI is the CUDA build, and its requirements pull about 3.5 GB
# more (cuDNN, cuBLAS, NCCL, nvrtc, triton...). Its CPU build is not on PyPI, and without the CUDA
# libraries its own shared libraries link, `import torch` fails. So torch goes in with --no-deps,
# then its pure-Python requirements and only the CUDA wheels its libraries link (the list of its
# requirements, less nvrtc, nvtx, cuda-bindings and triton, which only GPU code loads; tests/chart/
# test_images.py checks the list against torch's metadata); then the other requirements of the
# project and its `trainer` extra, read from pyproject.toml without torch, so that pip never
# resolves torch's requirements. A layer of its own, before the sources (and README.md, which the
# wheel's metadata includes) are copied: a code or README change rebuilds only the layers below.
RUN if [ "$VARIANT" = cpu ]; then \
      python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(*p["dependencies"], *p["optional-dependencies"]["trainer"], sep="\n")' > /tmp/requirements.txt \
   && pip install --no-deps $(grep '^torch==' /tmp/requirements.txt) \
   && grep -v '^torch==' /tmp/requirements.txt > /tmp/others.txt \
   && pip install -r /tmp/others.txt \
        filelock "typing-extensions>=4.10.0" "setuptools<82" "sympy>=1.13.3" "networkx>=2.5.1" \
        jinja2 "fsspec>=0.8.5" \
        "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink]==13.0.2" \
        "nvidia-cudnn-cu13==9.19.0.56" "nvidia-cusparselt-cu13==0.8.0" "nvidia-nccl-cu13==2.28.9" \
        "nvidia-nvshmem-cu13==3.4.5" \
   && rm /tmp/requirements.txt /tmp/others.txt; \
    fi

# One wheel holds all three packages (hatch lists them); only the gpu extra's dependencies are
# installed (cpu: none, they are in the layer above), so the operator's kopf is not, and the
# trainer never imports it.
COPY README.md ./
COPY operator/ operator/
COPY trainer/ trainer/
RUN if [ "$VARIANT" = cpu ]; then \
      pip install --no-deps . && python -c "import ray, torch, asyncgrpo_trainer"; \
    else \
      pip install ".[gpu]" && python -c "import ray, torch, vllm, megatron.core, asyncgrpo_trainer"; \
    fi

# Ray's images run as uid 1000 with a writable home; KubeRay and Ray expect that. Ubuntu 24.04
# images already have uid and gid 1000 (user `ubuntu`): remove it first, or useradd fails; Debian's
# have no such user.
RUN ! id -u ubuntu >/dev/null 2>&1 || userdel --remove ubuntu \
 && useradd --uid 1000 --user-group --create-home --shell /bin/bash ray
USER 1000
WORKDIR /home/ray
EXPOSE 6379 8265 10001
CMD ["python", "-m", "asyncgrpo_trainer"]
