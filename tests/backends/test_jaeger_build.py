"""scripts/jaeger_build.py without building: where the build goes, when it is reused, what
a failed build leaves behind; and the Jaeger config the tests run (loopback, no fixed
ports). The real build and run are in test_jaeger_prometheus.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scripts import jaeger_build
from tests.support.jaeger import jaeger_config


@pytest.fixture
def peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GYM_TELEMETRY_PEERS_DIR", str(tmp_path / "peers"))
    return tmp_path / "peers"


def test_binary_keyed_by_module_version_under_the_peers_dir(peers: Path) -> None:
    assert jaeger_build.binary_path("v1.76.0") == peers / "jaeger-v1.76.0" / "bin" / "jaeger"
    assert jaeger_build.release("v1.76.0") == "2.13.0"
    with pytest.raises(RuntimeError, match=r"no known 2\.x release"):
        jaeger_build.release("v0.0.1")


def test_go_caches_live_in_the_peers_dir(peers: Path) -> None:
    env = jaeger_build.go_env()
    assert env["GOMODCACHE"] == str(peers / "go" / "mod")
    assert env["GOCACHE"] == str(peers / "go" / "build")
    assert env["GOFLAGS"] == "-mod=mod" and env["GOTOOLCHAIN"] == "local"


def test_only_a_marker_of_this_recipe_counts_as_built(peers: Path) -> None:
    root = jaeger_build.build_dir()
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "jaeger").write_text("")
    assert not jaeger_build.is_built()  # a binary without the marker: interrupted build
    (root / jaeger_build.MARKER).write_text("github.com/jaegertracing/jaeger recipe 0\n")
    assert not jaeger_build.is_built()  # an older recipe
    (root / jaeger_build.MARKER).write_text(jaeger_build._marker_text(jaeger_build.MODULE_VERSION))
    assert jaeger_build.is_built()
    assert jaeger_build.ensure() == jaeger_build.binary_path()  # reused, nothing run


def test_a_failed_build_says_which_step_and_leaves_no_marker(
    peers: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GO", "false")  # every go command fails
    assert jaeger_build.main(["ensure"]) == 1
    assert "failed: false mod init" in capfd.readouterr().err
    assert not (jaeger_build.build_dir() / jaeger_build.MARKER).exists()


def test_missing_go_is_a_clear_error(peers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GO", raising=False)
    monkeypatch.setenv("PATH", str(peers))
    with pytest.raises(SystemExit, match="`go` is not on PATH"):
        jaeger_build.ensure()


def test_test_config_listens_on_loopback_only_and_opens_no_default_port() -> None:
    config = yaml.safe_load(jaeger_config(41001, 41002, 41003, 41004))
    text = yaml.safe_dump(config)
    endpoints = sorted(
        [p["endpoint"] for p in config["receivers"]["otlp"]["protocols"].values()]
        + [config["extensions"]["jaeger_query"][k]["endpoint"] for k in ("http", "grpc")]
    )
    assert endpoints == [f"127.0.0.1:4100{i}" for i in range(1, 5)]
    assert config["service"]["telemetry"]["metrics"]["level"] == "none"  # no :8888
    assert set(config["service"]["extensions"]) == {"jaeger_storage", "jaeger_query"}
    for default_port in ("4317", "4318", "16686", "16685", "13133", "8888", "5778"):
        assert default_port not in text
