# The asyncgrpo operator: kopf + the asyncgrpo API and webhook. No torch, no Ray.
#   docker build -f images/operator.Dockerfile -t ghcr.io/asyncgrpo/operator:0.1.0 .
# The chart runs it as uid 65532 with a read-only root filesystem and sets command and args itself
# (charts/asyncgrpo-operator/templates/deployment.yaml); the defaults below match them.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Only what the wheel is built from: the project metadata and the source roots it lists.
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer/ trainer/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 65532 asyncgrpo \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin asyncgrpo
COPY --from=build /wheels /wheels
# --no-index: exactly the wheels built above; the operator extra pulls in kopf and its clients only.
RUN pip install --no-index --find-links=/wheels "asyncgrpo[operator]" \
 && rm -rf /wheels \
 && python -c "import asyncgrpo_operator, sys; assert 'torch' not in sys.modules and 'ray' not in sys.modules"
USER 65532:65532
WORKDIR /tmp
# 9443: admission webhook (HTTPS), 8080: kopf liveness (/healthz), 9090: metrics.
EXPOSE 9443 8080 9090
# `python -m asyncgrpo_operator` = kopf run -m asyncgrpo_operator.main --standalone, all namespaces.
ENTRYPOINT ["python", "-m", "asyncgrpo_operator"]
CMD ["--liveness=http://0.0.0.0:8080/healthz", "--log-format=json", "--metrics-port=9090"]
