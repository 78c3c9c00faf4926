"""Unit tests of the enrichment parsers: OTEL_RESOURCE_ATTRIBUTES, downward-API files,
image references, peer addresses and Engine API documents."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from gym_sidecar.core.downward_api import SERVER_NAME_LABEL
from gym_sidecar.enrich.config import KubernetesConfig
from gym_sidecar.enrich.docker_lookup import (
    container_attributes,
    lookup_key,
    parse_image_reference,
    peer_ip,
)
from gym_sidecar.enrich.environment import (
    ResourceAttributesError,
    environment_attributes,
    parse_resource_attributes,
)
from gym_sidecar.enrich.host import host_arch
from gym_sidecar.enrich.kubernetes import kubernetes_attributes, parse_podinfo

from tests.support.docker_engine import FakeContainer, inspect_document


# -- OTEL_RESOURCE_ATTRIBUTES ------------------------------------------------------
def test_resource_attributes_percent_decoding_and_whitespace() -> None:
    text = " team = rl%20infra , url=http%3A%2F%2Fx%2Cy%3Dz,uni=%C3%A9t%C3%A9,plus=a+b"
    assert parse_resource_attributes(text) == {
        "team": "rl infra",
        "url": "http://x,y=z",
        "uni": "été",
        "plus": "a+b",
    }


def test_resource_attributes_empty_members_and_duplicates() -> None:
    assert parse_resource_attributes("a=1,,b=2,a=3,") == {"a": "3", "b": "2"}
    assert parse_resource_attributes("empty=") == {"empty": ""}


@pytest.mark.parametrize(
    "text",
    ["novalue", "=x", "a=%zz", "a=%C3", "a=1,%ZZ=2"],
)
def test_resource_attributes_errors(text: str) -> None:
    with pytest.raises(ResourceAttributesError):
        parse_resource_attributes(text)


def test_malformed_variable_is_discarded_whole(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    env = {"OTEL_RESOURCE_ATTRIBUTES": "good=1,bad"}
    assert environment_attributes(env) == {}
    assert "OTEL_RESOURCE_ATTRIBUTES" in caplog.text
    assert environment_attributes({"OTEL_RESOURCE_ATTRIBUTES": "good=1"}) == {"good": "1"}


# -- downward API files ------------------------------------------------------------
def test_podinfo_go_quoted_values(caplog: pytest.LogCaptureFixture) -> None:
    text = (
        'app="gym-model"\n'
        'nemo.gym/server-name="math_with_judge"\n'
        'quote="say \\"hi\\"\\n\\tdone \\u00e9"\n'
        "garbage line\n"
        'empty=""\n'
    )
    caplog.set_level(logging.WARNING)
    out = parse_podinfo(text, "labels")
    assert out == {
        "app": "gym-model",
        "nemo.gym/server-name": "math_with_judge",
        "quote": 'say "hi"\n\tdone é',
        "empty": "",
    }
    assert "labels line 4" in caplog.text


def test_kubernetes_env_and_selected_labels(tmp_path: Path) -> None:
    (tmp_path / "labels").write_text(f'app="a"\nsecret="s"\n{SERVER_NAME_LABEL}="srv"\n')
    (tmp_path / "annotations").write_text('team="rl"\nother="x"\n')
    cfg = KubernetesConfig(podinfo_dir=str(tmp_path), annotations=["team"])
    env = {"K8S_POD_NAME": "p-1", "K8S_NODE_NAME": "n-7", "K8S_POD_UID": ""}
    assert kubernetes_attributes(cfg, env) == {
        "k8s.pod.name": "p-1",
        "k8s.node.name": "n-7",
        "k8s.pod.label.app": "a",
        f"k8s.pod.label.{SERVER_NAME_LABEL}": "srv",
        "k8s.pod.annotation.team": "rl",
    }


def test_kubernetes_dir_from_env_and_missing_files(tmp_path: Path) -> None:
    env = {"GYM_SIDECAR_PODINFO_DIR": str(tmp_path / "absent")}
    assert kubernetes_attributes(KubernetesConfig(), env) == {}
    (tmp_path / "labels").write_text('app="x"\n')
    env = {"GYM_SIDECAR_PODINFO_DIR": str(tmp_path)}
    assert kubernetes_attributes(KubernetesConfig(), env) == {"k8s.pod.label.app": "x"}
    too_small = KubernetesConfig(max_file_bytes=3)
    assert kubernetes_attributes(too_small, env) == {}
    assert kubernetes_attributes(KubernetesConfig(enabled=False), env) == {}


# -- Docker ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("nginx", ("nginx", "latest")),
        ("nginx:1.25", ("nginx", "1.25")),
        ("registry:5000/org/img", ("registry:5000/org/img", "latest")),
        ("registry:5000/org/img:v2", ("registry:5000/org/img", "v2")),
        ("img@sha256:abcd", ("img", None)),
        ("img:1@sha256:abcd", ("img", "1")),
    ],
)
def test_image_reference(ref: str, expected: tuple[str, str | None]) -> None:
    assert parse_image_reference(ref) == expected


def test_peer_addresses() -> None:
    assert peer_ip("172.18.0.5:4444") == "172.18.0.5"
    assert peer_ip("ipv4:172.18.0.5:4444") == "172.18.0.5"
    assert peer_ip("[fd00::5]:4444") == "fd00::5"
    assert peer_ip("ipv6:[fd00::5]:4444") == "fd00::5"
    assert peer_ip("127.0.0.1:1") is None
    assert peer_ip("[::1]:1") is None
    assert peer_ip("unix:/tmp/x") is None


def test_lookup_keys() -> None:
    cid = "0123456789ab" * 4
    assert lookup_key(cid.upper(), "10.0.0.1:1", True) == ("id", cid)
    assert lookup_key("../../etc", "10.0.0.1:1", True) is None  # never sent to the engine
    assert lookup_key(None, "10.0.0.1:1", True) == ("ip", "10.0.0.1")
    assert lookup_key(None, "10.0.0.1:1", False) is None


def test_container_attributes_from_inspect_document() -> None:
    doc = inspect_document(
        FakeContainer(
            "f" * 64,
            "gym-judge-1",
            "gym/judge:0.3",
            {"com.docker.compose.project": "gym", "com.docker.compose.service": "judge"},
        )
    )
    assert container_attributes(doc, ["com.docker.compose.service", "missing"]) == {
        "container.id": "f" * 64,
        "container.name": "gym-judge-1",
        "container.image.name": "gym/judge",
        "container.image.tags": ("0.3",),
        "container.image.tag": "0.3",
        "container.label.com.docker.compose.service": "judge",
    }
    assert container_attributes({"Config": None, "Name": 5}, []) == {}


def test_host_arch_mapping() -> None:
    assert host_arch("x86_64") == "amd64"
    assert host_arch("aarch64") == "arm64"
    assert host_arch("riscv64") == "riscv64"
