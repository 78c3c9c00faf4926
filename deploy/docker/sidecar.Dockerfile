# gym-telemetry sidecar. The injection webhook has its own image (webhook.Dockerfile):
# this one does not carry its `webhook` extra (aiohttp, jsonpatch).
# Build from the repository root:
#   docker build -f deploy/docker/sidecar.Dockerfile -t gym-telemetry-sidecar:0.1.0 .
#
# Configuration: mount a YAML file and point GYM_SIDECAR_CONFIG (or `run --config`) at
# it, and/or set GYM_SIDECAR_<KEY> variables (GYM_SIDECAR_BACKEND__URL=...); the
# environment wins over the file. Ports: 4317 OTLP/gRPC, 4318 OTLP/HTTP, 13133 admin
# (/healthz, /readyz, /metrics, /v1/span-groups). Listeners default to 127.0.0.1; set
# GYM_SIDECAR_ADMIN_LISTEN=0.0.0.0:13133 (and the OTLP ones) to reach them from outside
# the container's network namespace.

ARG PYTHON_IMAGE=python:3.13-slim-bookworm

# --- build: the locked dependency set into a self-contained virtualenv ------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/gym-sidecar
RUN pip install "uv==0.13.9"
WORKDIR /src
COPY pyproject.toml uv.lock ./
# agent/ is only workspace metadata here (uv needs every member's pyproject): the sidecar
# depends on gym-telemetry-semconv, not on the agent, so the agent is not installed.
COPY semconv/ semconv/
COPY agent/pyproject.toml agent/
COPY sidecar/ sidecar/
# --frozen: exactly uv.lock; --no-editable: the venv does not need /src at run time.
RUN uv sync --frozen --no-dev --no-editable --package gym-telemetry-sidecar --extra docker
# The native trace scanner (sidecar-native/, docs/native.md), when its wheel was put in
# deploy/docker/wheels/ (`make native-wheel`; `make test` stages the one it built): a
# host-built abi3 wheel installed offline, so no Rust toolchain enters the image. The
# build log says which scanner the image runs.
COPY deploy/docker/wheels/ /wheels/
RUN for wheel in /wheels/gym_telemetry_sidecar_native-*.whl; do \
        [ -e "$wheel" ] || continue; \
        uv pip install --offline --no-deps --python /opt/gym-sidecar/bin/python "$wheel"; \
    done \
    && /opt/gym-sidecar/bin/python -c \
        "import gym_sidecar.wire.protobuf.scan as s; print('trace scanner:', s.active_scanner())"
# The runtime stage runs at PYTHONOPTIMIZE=2: its bytecode, compiled here at that level
# beside uv's (which a container run with PYTHONOPTIMIZE= still uses).
RUN /opt/gym-sidecar/bin/python -OO -m compileall -q -j 0 /opt/gym-sidecar/lib

# --- runtime: slim, non-root, no build tools ------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gym-telemetry-sidecar" \
      org.opencontainers.image.description="OTLP sidecar for NeMo Gym fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
# /var/lib/gym-sidecar: the data directory (local store when no backend is set, disk
# queue); mount a volume there to keep it, or a tmpfs with a read-only root filesystem.
RUN groupadd --system --gid 10001 gym \
    && useradd --system --uid 10001 --gid gym --no-create-home --shell /usr/sbin/nologin gym \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/gym-sidecar
# PYTHONOPTIMIZE=2 drops docstrings and assert statements: ~2 MiB less resident memory
# (docs/benchmarks.md); the sidecar reads no docstring and its asserts only narrow types.
# The standard library's bytecode at that level is compiled here, as root: the non-root
# user could not write it, and the interpreter would compile it again at every start.
RUN python -OO -m compileall -q -j 0 -x '/(test|tests|idle_test|idlelib|tkinter|turtledemo|ensurepip)/' \
        "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"
COPY --from=build /opt/gym-sidecar /opt/gym-sidecar
ENV PATH=/opt/gym-sidecar/bin:$PATH \
    PYTHONOPTIMIZE=2 \
    PYTHONUNBUFFERED=1 \
    XDG_DATA_HOME=/var/lib \
    HEALTHCHECK_URL=http://127.0.0.1:13133/healthz
USER 10001:10001
EXPOSE 4317 4318 13133
# No curl in a slim image: the interpreter already there does the request.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os,sys,urllib.request as u; sys.exit(0 if u.urlopen(os.environ['HEALTHCHECK_URL'], timeout=2).status == 200 else 1)"]
ENTRYPOINT ["gym-sidecar"]
CMD ["run"]
