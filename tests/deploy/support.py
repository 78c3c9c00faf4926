"""Helpers of the deployment tests: throwaway TLS certificates and Kubernetes schemas."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.control_plane import on_ci
from tests.support.kustomize import KustomizeUnavailable, kustomize_build

K8S_VERSION = "1.29.0"
"""The oldest version with native sidecars on by default; kubernetes-validate ships it."""
REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


def write_self_signed(directory: Path, common_name: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed server certificate for 127.0.0.1; returns (cert, key) PEM paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def validate_k8s(obj: dict[str, Any], version: str = K8S_VERSION) -> None:
    """Validate one object against the Kubernetes OpenAPI schema, strict (no unknown keys).

    Raises kubernetes_validate.ValidationError with the failing path.
    """
    kubernetes_validate.validate(obj, version, strict=True)


def as_pod(spec_holder: dict[str, Any]) -> dict[str, Any]:
    """Wrap a pod object as the API would store it (apiVersion/kind present)."""
    return {"apiVersion": "v1", "kind": "Pod", **spec_holder}


def render(kustomization: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize deploy/k8s/<kustomization>`` renders.

    kubectl is the pinned v1.37.2 (embedded kustomize v5.8.1) from
    :mod:`tests.support.kustomize`, built on first use with the control plane; when it
    cannot be had the test fails on CI (``CI=true``) and is skipped elsewhere.
    """
    try:
        out = kustomize_build(K8S / kustomization)
    except KustomizeUnavailable as exc:
        if on_ci():
            pytest.fail(f"kustomize (kubectl) unavailable: {exc}")
        pytest.skip(f"kustomize (kubectl) unavailable: {exc}")
    return [d for d in yaml.safe_load_all(out) if d]
