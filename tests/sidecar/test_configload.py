"""The one configuration loader the sidecar and the webhook share (gym_sidecar.configload):
the same precedence, the same environment rules, the same HOST:PORT check, Collector-style
``${env:VAR}`` expansion, and every problem reported together with its key path."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gym_sidecar.config import ConfigError, load_config
from gym_sidecar.configload import env_value, expand_env
from gym_sidecar.webhook.config import InjectorConfigError, load_injector_config


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- one loader, one set of rules ----------------------------------------------------------
def test_both_programs_take_argument_over_environment_over_file_over_default(
    tmp_path: Path,
) -> None:
    side = write(tmp_path, "log_level: error\nshutdown_timeout_s: 3\n", "sidecar.yaml")
    cfg = load_config(
        side,
        {"GYM_SIDECAR_LOG_LEVEL": "warning", "GYM_SIDECAR_SHUTDOWN_TIMEOUT_S": "4"},
        {"log_level": "debug"},
    )
    assert (cfg.log_level, cfg.shutdown_timeout_s) == ("debug", 4)

    inj = write(tmp_path, "image: file\ncontainer_name: file\n", "injector.yaml")
    icfg = load_injector_config(
        inj, {"GYM_INJECTOR_IMAGE": "env", "GYM_INJECTOR_CONTAINER_NAME": "env"}, {"image": "arg"}
    )
    assert (icfg.image, icfg.container_name, icfg.config_key) == ("arg", "env", "sidecar.yaml")


def test_environment_values_follow_the_same_rules_in_both() -> None:
    # null is none, a flow collection is YAML, anything else is text the field converts
    cfg = load_config(None, {"GYM_SIDECAR_ENRICH__ATTRIBUTES": "{a: b}"})
    assert cfg.enrich.attributes == {"a": "b"}
    icfg = load_injector_config(
        None,
        {
            "GYM_INJECTOR_CONFIG_MAP": "null",
            "GYM_INJECTOR_SIDECAR_ENV": "{GYM_SIDECAR_LOG_LEVEL: debug}",
            "GYM_INJECTOR_ADMIN_PORT": "14000",
        },
    )
    assert icfg.config_map is None
    assert icfg.sidecar_env == {"GYM_SIDECAR_LOG_LEVEL": "debug"}
    assert icfg.admin_port == 14000
    # the webhook used to YAML-parse every value: "1.30" stayed a float and failed as a
    # version string; now both programs keep text for the field to read
    assert load_injector_config(None, {"GYM_INJECTOR_KUBERNETES_VERSION": "1.30"}).native_sidecar()
    assert env_value("X", "  ~ ") is None and env_value("X", "yes") == "yes"


def test_a_broken_flow_collection_names_its_variable_in_both() -> None:
    with pytest.raises(ConfigError) as side:
        load_config(None, {"GYM_SIDECAR_ENRICH__ATTRIBUTES": "{a: b"})
    assert side.value.errors[0].startswith("GYM_SIDECAR_ENRICH__ATTRIBUTES: ")
    with pytest.raises(InjectorConfigError) as inj:
        load_injector_config(None, {"GYM_INJECTOR_APP_ENV": "[x"})
    assert inj.value.errors[0].startswith("GYM_INJECTOR_APP_ENV: ")


def test_the_webhook_checks_listen_addresses_like_the_sidecar() -> None:
    """The webhook had its own splitter, which took ``::1:8443`` and ``:8443``."""
    for bad in ("::1:8443", ":8443", "host:99999"):
        with pytest.raises(InjectorConfigError) as err:
            load_injector_config(None, {}, {"listen": bad})
        assert err.value.errors[0].startswith("listen: ")
        with pytest.raises(ConfigError):
            load_config(None, {}, {"grpc_listen": bad})
    assert load_injector_config(None, {}, {"listen": "[::1]:0"}).listen == "[::1]:0"


def test_every_layer_problem_comes_out_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "backend:\n  url: ${env:NOT_SET_ANYWHERE}\nqueue: {max_bytes: 0}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, {"GYM_SIDECAR_ENRICH__ATTRIBUTES": "{", "GYM_SIDECAR_LOG_LEVEL": "loud"})
    text = "\n".join(err.value.errors)
    assert f"{path}: backend.url: environment variable NOT_SET_ANYWHERE is not set" in text
    assert "GYM_SIDECAR_ENRICH__ATTRIBUTES: " in text
    assert "queue.max_bytes: " in text and "log_level: " in text


# -- ${env:VAR} as the Collector expands it ---------------------------------------------------
def test_env_references_are_expanded_in_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "backend:\n"
        "  url: http://${env:BACKEND_HOST}:${BACKEND_PORT}\n"
        "  headers:\n"
        "    authorization: Bearer ${env:TOKEN}\n"
        "    x-literal: $${env:TOKEN} costs $$5\n"
        "    x-default: ${env:UNSET_WITH_DEFAULT:-fallback}\n"
        "  timeout_s: ${env:TIMEOUT}\n",
    )
    env = {"BACKEND_HOST": "jaeger", "BACKEND_PORT": "4317", "TOKEN": "s3cret", "TIMEOUT": "7"}
    cfg = load_config(path, env)
    assert cfg.backend.url == "http://jaeger:4317"
    assert cfg.backend.headers == {
        "authorization": "Bearer s3cret",
        "x-literal": "${env:TOKEN} costs $5",
        "x-default": "fallback",
    }
    assert cfg.backend.timeout_s == 7


def test_an_unset_variable_names_itself_and_its_key(tmp_path: Path) -> None:
    path = write(tmp_path, "enrich:\n  attributes:\n    team: ${env:TEAM_NAME}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert err.value.errors == [
        f"{path}: enrich.attributes.team: environment variable TEAM_NAME is not set "
        "(${env:TEAM_NAME})"
    ]


def test_the_webhook_file_is_expanded_too(tmp_path: Path) -> None:
    path = write(tmp_path, "image: registry.example/sidecar:${env:SIDECAR_TAG}\n")
    assert load_injector_config(path, {"SIDECAR_TAG": "1.2"}).image.endswith(":1.2")
    with pytest.raises(InjectorConfigError, match="SIDECAR_TAG is not set"):
        load_injector_config(path, {})


def test_malformed_references_are_reported() -> None:
    out, errors = expand_env({"a": ["${}", "${env:1BAD}", "${file:/x}", "$notref", "$"]}, {})
    assert out["a"][3:] == ["$notref", "$"]  # a lone $ is text, as in the Collector
    assert len(errors) == 3 and all(e.startswith("a[") for e in errors)


# -- errors that name the file ----------------------------------------------------------------
@pytest.mark.parametrize("program", ["sidecar", "webhook"])
def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path: Path, program: str) -> None:
    path = write(tmp_path, "backend:\n  url: [\n")
    loader = load_config if program == "sidecar" else load_injector_config
    with pytest.raises(ConfigError) as err:
        loader(path, {})
    [message] = err.value.errors
    assert message.startswith(f"{path}: not valid YAML at line 3, column 1: ")
    assert "<unicode string>" not in message


# -- every problem at once -----------------------------------------------------------------
def test_a_url_without_scheme_is_reported_with_the_other_backend_errors() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            None, {}, {"backend": {"url": "jaeger:4317", "timeout_s": 0, "protocol": "smtp"}}
        )
    keys = sorted(e.split(":", 1)[0] for e in err.value.errors)
    assert keys == ["backend.protocol", "backend.timeout_s", "backend.url"]
    assert "must start with http:// or https://, got 'jaeger:4317'" in "\n".join(err.value.errors)


# -- redaction -----------------------------------------------------------------------------
SECRET = "Bearer s3cret-t0ken"
HEADERS_YAML = "backend:\n  url: http://x:4317\n  headers:\n    authorization: {value}\n"


def test_backend_header_values_are_opaque(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(
        tmp_path, "backend:\n  url: http://x:4317\n  headers:\n    authorization: ${TOK}\n"
    )
    cfg = load_config(path, {"TOK": SECRET})
    value = cfg.backend.headers["authorization"]
    assert value == SECRET and value.lower() == SECRET.lower()  # used as the real text
    assert SECRET not in repr(cfg) and SECRET not in repr(cfg.backend.headers)
    assert SECRET not in f"{cfg.backend.headers}" and "[REDACTED]" in repr(cfg.backend)
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("backend %s headers %s", cfg.backend, cfg.backend.headers)
    assert SECRET not in caplog.text and "[REDACTED]" in caplog.text
    assert cfg.backend.model_dump(mode="json")["headers"] == {"authorization": "[REDACTED]"}


def test_check_config_prints_header_values_redacted(tmp_path: Path) -> None:
    path = write(
        tmp_path, f"backend:\n  url: http://x:4317\n  headers:\n    authorization: {SECRET}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")},
    )
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert yaml.safe_load(result.stdout)["backend"]["headers"] == {"authorization": "[REDACTED]"}


def test_gym_sidecar_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    expected = importlib.metadata.version("gym-telemetry-sidecar")
    assert result.stdout.strip() == f"gym-sidecar {expected}"
