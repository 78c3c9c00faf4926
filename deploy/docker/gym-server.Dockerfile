# A NeMo Gym server with the gym-telemetry agent installed and switched on.
# Build from the repository root:
#   docker build -f deploy/docker/gym-server.Dockerfile -t gym-server:0.1.0 .
# Run any Gym server of a config file (its top-level key):
#   docker run -v $PWD/stack.yaml:/etc/gym/stack.yaml gym-server:0.1.0 \
#       /etc/gym/stack.yaml policy_model
# The agent sends OTLP to $OTEL_EXPORTER_OTLP_ENDPOINT (default: a sidecar on localhost).

# The full (not slim) image: nemo-gym's dependency tree installs here as on a workstation,
# compilers included for any source distribution. nemo-gym requires Python 3.13.
FROM python:3.13-bookworm

ARG NEMO_GYM_VERSION=0.7.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
# nemo-gym 0.7.0's wheel declares Requires-Python >=3.13.14, which most 3.13 builds
# (Debian's included) do not meet although its code runs on them. So: the wheel alone,
# then its dependencies that are not behind an extra (still checked against this
# Python), then the wheel without its Python check. On a 3.13.14+ base this installs
# what `pip install nemo-gym` would.
COPY deploy/docker/wheel_requirements.py /usr/local/bin/wheel-requirements
WORKDIR /tmp/nemo-gym
RUN pip download --no-deps --ignore-requires-python --dest . "nemo-gym==${NEMO_GYM_VERSION}" \
    && python /usr/local/bin/wheel-requirements ./*.whl > requirements.txt \
    && pip install --prefer-binary -r requirements.txt \
    && pip install --no-deps --ignore-requires-python ./*.whl \
    && python -c "import nemo_gym.server_utils" \
    && rm -rf /tmp/nemo-gym
WORKDIR /

# The agent, built from this tree as a wheel: it installs the one-line .pth that turns
# the instrumentation on in every Python process when GYM_TELEMETRY is set. Its shared
# names (gym-telemetry-semconv) are not on PyPI: they are installed from this tree too,
# in the same command, so pip resolves the agent's dependency on them locally.
COPY semconv/ /src/semconv/
COPY agent/ /src/agent/
RUN pip install /src/semconv /src/agent && rm -rf /src

# Servers beyond the ones nemo-gym ships (the project's stub model for offline demos).
COPY examples/gym_stack/ /opt/gym-servers/
COPY deploy/docker/gym_server_launch.py /usr/local/bin/gym-server-launch
COPY deploy/docker/rollout_driver.py /usr/local/bin/gym-rollout-driver
RUN chmod 0755 /usr/local/bin/gym-server-launch /usr/local/bin/gym-rollout-driver \
    && groupadd --gid 10001 gym \
    && useradd --uid 10001 --gid gym --create-home --shell /bin/bash gym

ENV GYM_TELEMETRY=1 \
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 \
    GYM_SERVER_PATH=/opt/gym-servers
USER 10001:10001
WORKDIR /home/gym
ENTRYPOINT ["python", "/usr/local/bin/gym-server-launch"]
