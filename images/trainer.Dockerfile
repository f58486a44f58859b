# The asyncgrpo trainer: CUDA, Ray, vLLM, Megatron-core and asyncgrpo's `gpu` extra.
#   docker build -f images/trainer.Dockerfile -t ghcr.io/asyncgrpo/trainer:0.1.0 .
# KubeRay runs this image for the head and every worker: it replaces the command with `ray start`
# (so there is no ENTRYPOINT to get in its way), and the operator starts the driver on the head
# with the command below (`python -m asyncgrpo_trainer --job-spec /etc/asyncgrpo/job.json`).

# CUDA 13.0: the torch the `gpu` extra pins (torch==2.11.0, whose PyPI wheel is built for CUDA 13.0,
# `+cu130`) and vLLM 0.26 built against it; tests/chart/test_images.py checks the two agree.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

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

# One wheel holds all three packages (hatch lists them); only the gpu extra's dependencies are
# installed, so the operator's kopf is not, and the trainer never imports it.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer/ trainer/
RUN pip install ".[gpu]" \
 && python -c "import ray, torch, vllm, megatron.core, asyncgrpo_trainer"

# Ray's images run as uid 1000 with a writable home; KubeRay and Ray expect that. Ubuntu 24.04
# images already have uid and gid 1000 (user `ubuntu`): remove it first, or useradd fails.
RUN userdel --remove ubuntu \
 && useradd --uid 1000 --user-group --create-home --shell /bin/bash ray
USER 1000
WORKDIR /home/ray
EXPOSE 6379 8265 10001
CMD ["python", "-m", "asyncgrpo_trainer"]
