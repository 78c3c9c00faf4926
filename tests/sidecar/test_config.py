"""Config loading: precedence flags > env > file > defaults, every error at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gym_sidecar.cli import build_parser, flag_overrides
from gym_sidecar.config import ConfigError, SidecarConfig, load_config, split_host_port


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_listen_on_loopback_only() -> None:
    cfg = load_config(None, environ={})
    assert cfg.grpc_listen == "127.0.0.1:4317"
    assert cfg.http_listen == "127.0.0.1:4318"
    assert cfg.admin_listen == "127.0.0.1:13133"
    assert cfg.limits.http_max_body_bytes == 16 * 1024 * 1024
    assert cfg.limits.http_max_decompressed_bytes == 64 * 1024 * 1024
    assert cfg.backend.url is None


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "grpc_listen: 127.0.0.1:1001\n"
        "http_listen: 127.0.0.1:1002\n"
        "admin_listen: 127.0.0.1:1003\n"
        "backend: {url: http://file:4317, timeout_s: 3}\n"
        "queue: {max_bytes: 1000000, batch_max_bytes: 1000}\n",
    )
    env = {
        "GYM_SIDECAR_HTTP_LISTEN": "127.0.0.1:2002",
        "GYM_SIDECAR_ADMIN_LISTEN": "127.0.0.1:2003",
        "GYM_SIDECAR_BACKEND__URL": "http://env:4317",
        "GYM_SIDECAR_QUEUE__MAX_BYTES": "2000000",
        "GYM_SIDECAR_ENRICH__ATTRIBUTES": "{team: rl, zone: a}",
        "OTHER_VAR": "ignored",
    }
    args = build_parser().parse_args(
        ["run", "--admin-listen", "127.0.0.1:3003", "--backend-protocol", "http/protobuf"]
    )
    cfg = load_config(path, env, flag_overrides(args))
    assert cfg.grpc_listen == "127.0.0.1:1001"  # file only
    assert cfg.http_listen == "127.0.0.1:2002"  # env beats file
    assert cfg.admin_listen == "127.0.0.1:3003"  # flag beats env
    assert cfg.backend.url == "http://env:4317"
    assert cfg.backend.timeout_s == 3  # nested keys merge, not replace
    assert cfg.backend.protocol == "http/protobuf"
    assert cfg.queue.max_bytes == 2_000_000  # env string converted to int
    assert cfg.queue.batch_max_bytes == 1000
    assert cfg.enrich.attributes == {"team": "rl", "zone": "a"}


def test_backend_flag_env_twins() -> None:
    env = {
        "GYM_SIDECAR_BACKEND": "http://alias:4317",
        "GYM_SIDECAR_BACKEND_COMPRESSION": "gzip",
    }
    cfg = load_config(None, env)
    assert cfg.backend.url == "http://alias:4317"
    assert cfg.backend.compression == "gzip"
    env["GYM_SIDECAR_BACKEND__URL"] = "http://nested:4317"
    assert load_config(None, env).backend.url == "http://nested:4317"


def test_variables_that_are_not_config_keys_are_not_errors() -> None:
    """The webhook's podinfo directory and the trace scanner switch (docs/sidecar.md)."""
    env = {"GYM_SIDECAR_PODINFO_DIR": "/podinfo", "GYM_SIDECAR_NATIVE": "0"}
    assert load_config(None, env).model_dump() == load_config(None, {}).model_dump()
    with pytest.raises(ConfigError, match="natives: Extra inputs are not permitted"):
        load_config(None, {"GYM_SIDECAR_NATIVES": "0"})


def test_all_errors_reported_at_once_with_key_paths(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "grpc_listen: nohost\n"
        "http_listen: 127.0.0.1:99999\n"
        "queue: {max_bytes: 0}\n"
        "limits: {http_max_body_bytes: -1}\n"
        "bogus_key: 1\n",
    )
    env = {"GYM_SIDECAR_SHUTDOWN_TIMEOUT_S": "soon", "GYM_SIDECAR_BACKEND__PROTOCOL": "smoke"}
    with pytest.raises(ConfigError) as info:
        load_config(path, env, {"log_level": "loud"})
    errors = info.value.errors
    joined = "\n".join(errors)
    for expected in (
        "grpc_listen: Value error, expected HOST:PORT",
        "http_listen: Value error, port must be an integer in 0..65535",
        "queue.max_bytes: Input should be greater than 0",
        "limits.http_max_body_bytes: Input should be greater than 0",
        "bogus_key: Extra inputs are not permitted",
        "shutdown_timeout_s: Input should be a valid number",
        "backend.protocol: Input should be 'grpc' or 'http/protobuf'",
        "log_level: Input should be",
    ):
        assert expected in joined, joined
    assert len(errors) == 8


def test_metrics_interval_key_is_nested(tmp_path: Path) -> None:
    """Issue 5's ``metrics_interval_s`` is ``metrics.interval_s`` (docs/metrics.md)."""
    cfg = load_config(write(tmp_path, "metrics: {interval_s: 30}\n"), {})
    assert cfg.metrics.interval_s == 30
    env = {"GYM_SIDECAR_METRICS__INTERVAL_S": "2.5"}
    assert load_config(None, env).metrics.interval_s == 2.5
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "metrics_interval_s: 30\n"), {})
    assert info.value.errors == ["metrics_interval_s: Extra inputs are not permitted"]


def test_file_errors_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", {})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [1, 2\n"), {})
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"), {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:4317", ("127.0.0.1", 4317)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::]:4318", ("::", 4318)),
        ("[::1]:1", ("::1", 1)),
        ("localhost:13133", ("localhost", 13133)),
    ],
)
def test_host_port_valid(value: str, expected: tuple[str, int]) -> None:
    assert split_host_port(value) == expected


@pytest.mark.parametrize(
    "value", ["4317", ":4317", "host:", "host:http", "::1:4317", "[nope]:1", "h:70000"]
)
def test_host_port_invalid(value: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(value)


def test_transport_limit_must_cover_message_limit() -> None:
    with pytest.raises(ConfigError, match="grpc_transport_max_bytes must be >="):
        load_config(None, {"GYM_SIDECAR_LIMITS__GRPC_TRANSPORT_MAX_BYTES": "10"})


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        check=False,
        timeout=60,
    )


def test_check_config_ok_prints_effective_config(tmp_path: Path) -> None:
    path = write(tmp_path, "backend: {url: http://b:4317}\n")
    result = run_cli(
        "check-config",
        str(path),
        "--grpc-listen",
        "0.0.0.0:4317",
        env={"GYM_SIDECAR_LOG_LEVEL": "debug"},
    )
    assert result.returncode == 0, result.stderr
    assert "grpc_listen: 0.0.0.0:4317" in result.stdout
    assert "url: http://b:4317" in result.stdout
    assert "log_level: debug" in result.stdout
    SidecarConfig.model_validate(__import__("yaml").safe_load(result.stdout))


def test_check_config_errors_exit_2_listing_all(tmp_path: Path) -> None:
    path = write(tmp_path, "queue: {max_bytes: 0}\nadmin_listen: x\n")
    result = run_cli("check-config", str(path))
    assert result.returncode == 2
    assert "queue.max_bytes: Input should be greater than 0" in result.stderr
    assert "admin_listen: Value error" in result.stderr
    missing = run_cli("check-config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


def test_run_with_bad_config_exits_2_and_usage_errors(tmp_path: Path) -> None:
    result = run_cli("run", env={"GYM_SIDECAR_QUEUE__MAX_BYTES": "-5"})
    assert result.returncode == 2
    assert "queue.max_bytes" in result.stderr
    bad_flag = run_cli("run", "--backend-protocol", "carrier-pigeon")
    assert bad_flag.returncode == 2
    assert "invalid choice" in bad_flag.stderr
