"""The ``local_store`` section: defaults, flags, environment and when the store is on."""

from __future__ import annotations

from pathlib import Path

import pytest
from gym_sidecar.cli import build_parser, flag_overrides
from gym_sidecar.config import ConfigError, load_config
from gym_sidecar.store.config import DB_FILE_NAME, LocalStoreConfig, default_data_dir


def test_default_dir_follows_xdg_data_home() -> None:
    assert default_data_dir({"XDG_DATA_HOME": "/data"}) == Path("/data/gym-sidecar")
    assert default_data_dir({}) == Path.home() / ".local" / "share" / "gym-sidecar"
    cfg = LocalStoreConfig()
    assert cfg.db_path({"XDG_DATA_HOME": "/x"}) == Path("/x/gym-sidecar") / DB_FILE_NAME


@pytest.mark.parametrize(
    ("enabled", "has_backend", "active"),
    [(None, False, True), (None, True, False), (True, True, True), (False, False, False)],
)
def test_active(enabled: bool | None, has_backend: bool, active: bool) -> None:
    assert LocalStoreConfig(enabled=enabled).active(has_backend) is active


def test_flags_and_environment() -> None:
    args = build_parser().parse_args(["run", "--local-store", "--store-dir", "/tmp/s"])
    cfg = load_config(None, {}, flag_overrides(args))
    assert cfg.local_store.enabled is True
    assert cfg.local_store.data_dir == Path("/tmp/s")
    args = build_parser().parse_args(["run", "--no-local-store"])
    assert load_config(None, {}, flag_overrides(args)).local_store.enabled is False
    env = {"GYM_SIDECAR_LOCAL_STORE": "false", "GYM_SIDECAR_STORE_DIR": "/e"}
    cfg = load_config(None, env)
    assert cfg.local_store.enabled is False
    assert cfg.local_store.data_dir == Path("/e")
    nested = {"GYM_SIDECAR_LOCAL_STORE": "false", "GYM_SIDECAR_LOCAL_STORE__ENABLED": "true"}
    assert load_config(None, nested).local_store.enabled is True  # nested spelling wins


def test_bad_values_are_reported_with_their_key_paths() -> None:
    env = {"GYM_SIDECAR_LOCAL_STORE__MAX_BYTES": "10", "GYM_SIDECAR_LOCAL_STORE__MAX_AGE_S": "0"}
    with pytest.raises(ConfigError) as info:
        load_config(None, env)
    text = str(info.value)
    assert "local_store.max_bytes" in text
    assert "local_store.max_age_s" in text
