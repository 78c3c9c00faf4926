# gym-telemetry injection webhook (`gym-sidecar webhook`): the sidecar distribution with
# its `webhook` extra (aiohttp, jsonpatch), which the sidecar image does not carry.
# Build from the repository root:
#   docker build -f deploy/docker/webhook.Dockerfile -t gym-telemetry-webhook:0.1.0 .
#
# Configuration: `--config FILE` (the injector YAML) and/or GYM_INJECTOR_<KEY> variables
# (docs/deployment.md). Port 8443 HTTPS (/mutate/*, /healthz, /metrics).

ARG PYTHON_IMAGE=python:3.13-slim-bookworm

# --- build: the locked dependency set, with the webhook extra -------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/gym-sidecar
RUN pip install "uv==0.13.9"
WORKDIR /src
COPY pyproject.toml uv.lock ./
# agent/ is only workspace metadata here (uv needs every member's pyproject): the webhook,
# like the sidecar, depends on gym-telemetry-semconv, not on the agent.
COPY semconv/ semconv/
COPY agent/pyproject.toml agent/
COPY sidecar/ sidecar/
# --frozen: exactly uv.lock; --no-editable: the venv does not need /src at run time.
RUN uv sync --frozen --no-dev --no-editable --package gym-telemetry-sidecar --extra webhook

# --- runtime: slim, non-root, no build tools ------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gym-telemetry-webhook" \
      org.opencontainers.image.description="Sidecar-injection admission webhook for NeMo Gym fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 gym \
    && useradd --system --uid 10001 --gid gym --no-create-home --shell /usr/sbin/nologin gym
COPY --from=build /opt/gym-sidecar /opt/gym-sidecar
ENV PATH=/opt/gym-sidecar/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["gym-sidecar", "webhook"]
