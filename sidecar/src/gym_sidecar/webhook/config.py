"""Configuration of the sidecar-injection webhook (``gym-sidecar webhook``).

Loaded by the sidecar's own loader (:mod:`gym_sidecar.configload`), so the rules are
the same. Sources, highest precedence first: command-line flags, environment variables
``GYM_INJECTOR_<KEY>`` (nested keys joined with ``__``: ``GYM_INJECTOR_IMAGE``,
``GYM_INJECTOR_RESOURCES__LIMITS__CPU``; ``{...}``/``[...]`` values are YAML flow
collections, ``null`` is none), the YAML file given with ``--config`` (``${env:VAR}``
expanded), the defaults below. The injector deliberately does not read
``GYM_SIDECAR_*``: those belong to the sidecar it injects.

Adding a setting is adding a field to :class:`InjectorConfig` (with a default).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import gym_telemetry_semconv as semconv

from gym_sidecar.configload import ConfigError, ListenAddress, load_layers
from gym_sidecar.configmodel import Field, Section, field_validator, model_validator
from gym_sidecar.hostport import split_host_port
from gym_sidecar.webhook.otlp_env import DERIVED_VARIABLES, OtlpProtocol

ENV_PREFIX = "GYM_INJECTOR_"
"""Prefix of every environment variable the injector reads."""

MiB = 1024 * 1024


def parse_version(text: str) -> tuple[int, int]:
    """``"v1.29.3-eks-1"`` or ``"1.29"`` -> ``(1, 29)``; raises ValueError otherwise."""
    core = text.strip().lstrip("v").split("-", 1)[0].split("+", 1)[0]
    parts = core.split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        raise ValueError(f"expected a Kubernetes version like 1.29 or v1.29.3, got {text!r}")
    minor = "".join(ch for ch in parts[1] if ch.isdigit())  # GKE/EKS spell "29+"
    if not minor:
        raise ValueError(f"expected a Kubernetes version like 1.29 or v1.29.3, got {text!r}")
    return int(parts[0]), int(minor)


class ResourceAmounts(Section):
    cpu: str
    memory: str


class SecretKey(Section):
    """A key of a Secret in the pod's namespace."""

    name: str
    key: str


class SidecarResources(Section):
    """Requests and limits of the injected sidecar container."""

    requests: ResourceAmounts = ResourceAmounts(cpu="50m", memory="64Mi")
    limits: ResourceAmounts = ResourceAmounts(cpu="1", memory="256Mi")


class Capabilities(Section):
    """Linux capabilities added to and dropped from the sidecar container."""

    add: list[str] | None = None
    drop: list[str] | None = Field(default_factory=lambda: ["ALL"])


class SeccompProfile(Section):
    """The sidecar container's seccomp profile (Kubernetes ``SeccompProfile``)."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = "RuntimeDefault"
    localhost_profile: str | None = None
    """Path of the profile on the node, for ``type: Localhost`` only."""

    @model_validator(mode="after")
    def _localhost(self) -> SeccompProfile:
        if (self.type == "Localhost") != (self.localhost_profile is not None):
            raise ValueError("localhost_profile is set exactly when type is Localhost")
        return self


class SidecarSecurityContext(Section):
    """The injected container's ``securityContext``, in snake_case (each key is the
    Kubernetes field of the same name: ``run_as_non_root`` is ``runAsNonRoot``).

    The defaults satisfy the ``restricted`` Pod Security Standard (non-root, no
    privilege escalation, every capability dropped, the runtime's default seccomp
    profile) plus a read-only root filesystem, so injection never makes a pod
    inadmissible in a ``restricted`` namespace. A key set to null is left out.
    """

    run_as_non_root: bool | None = True
    run_as_user: int | None = Field(default=None, ge=0)
    """None: the image's user (the sidecar image runs as 10001)."""
    run_as_group: int | None = Field(default=None, ge=0)
    allow_privilege_escalation: bool | None = False
    privileged: bool | None = None
    read_only_root_filesystem: bool | None = True
    capabilities: Capabilities | None = Field(default_factory=Capabilities)
    seccomp_profile: SeccompProfile | None = Field(default_factory=SeccompProfile)

    def to_kubernetes(self) -> dict[str, Any]:
        """The camelCase ``securityContext`` object, without the unset keys."""
        out: dict[str, Any] = _camel(self.model_dump(exclude_none=True))
        return out


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key.split("_")[0] + "".join(w.title() for w in key.split("_")[1:]): _camel(v)
            for key, v in value.items()
        }
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


class InjectorConfig(Section):
    """What the injector adds to a pod, and how it serves."""

    listen: ListenAddress = "0.0.0.0:8443"
    """HTTPS listen address of the webhook (``HOST:PORT``)."""
    cert_file: str | None = None
    """PEM certificate chain served to the API server (``tls.crt`` of the Secret)."""
    key_file: str | None = None
    """PEM private key (``tls.key``)."""
    cert_reload_interval_s: float = Field(default=60.0, gt=0)
    """How often the certificate files are checked for rotation (cert-manager renews)."""
    max_request_bytes: int = Field(default=8 * MiB, gt=0)
    """Largest AdmissionReview body read; larger ones are allowed unmodified and counted."""

    image: str = "gym-telemetry-sidecar:0.1.0"
    """Sidecar image injected into pods."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    container_name: str = "gym-telemetry-sidecar"
    """Name of the injected container; also how a second injection is recognised."""
    config_map: str | None = "gym-telemetry-sidecar"
    """ConfigMap (in the pod's namespace) mounted as the sidecar's config; None: none."""
    config_key: str = "sidecar.yaml"
    """Key of the ConfigMap holding the sidecar's YAML config."""
    sidecar_env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the sidecar container (e.g. ``GYM_SIDECAR_BACKEND__URL``)."""
    sidecar_secret_env: dict[str, SecretKey] = Field(default_factory=dict)
    """Sidecar variables read from Secrets of the pod's namespace (e.g. the span-group
    API token ``GYM_SIDECAR_SPAN_GROUPS__TOKEN``); optional refs, so a missing Secret
    never keeps the pod from starting."""
    app_env: dict[str, str] = Field(default_factory=dict)
    """Set on every app container that does not already set the variable. The OTLP
    endpoint and protocol variables are not set here: they follow ``otlp_protocol`` and
    the ports (:mod:`gym_sidecar.webhook.otlp_env`)."""
    otlp_protocol: OtlpProtocol = "grpc"
    """The OTLP protocol app containers are told to use when they choose none
    (``OTEL_EXPORTER_OTLP_PROTOCOL``), with the endpoint of the sidecar port serving it
    (``grpc``: ``grpc_port``; ``http/protobuf``, ``http/json``: ``http_port``). An app's
    own protocol or endpoint is kept, and its endpoint follows its protocol."""
    resources: SidecarResources = Field(default_factory=SidecarResources)
    data_size_limit: str = "1Gi"
    """``sizeLimit`` of the sidecar's emptyDir data volume (local store, disk queue)."""
    admin_port: int = Field(default=semconv.DEFAULT_ADMIN_PORT, gt=0, lt=65536)
    """Sidecar admin listener port: probes hit ``/healthz`` and ``/readyz`` there, and
    the app containers' agents poll their span groups there (the injector sets
    ``GYM_TELEMETRY_SIDECAR_ADMIN_URL=http://localhost:<admin_port>`` on them)."""
    grpc_port: int = Field(default=4317, gt=0, lt=65536)
    http_port: int = Field(default=4318, gt=0, lt=65536)
    startup_failure_threshold: int = Field(default=60, gt=0)
    """Startup probe attempts (1 s apart) before the kubelet restarts the sidecar."""
    security_context: SidecarSecurityContext = Field(default_factory=SidecarSecurityContext)
    """The sidecar container's ``securityContext`` (defaults: ``restricted``-compliant)."""

    sidecar_mode: Literal["auto", "native", "container"] = "auto"
    """``native``: an init container with ``restartPolicy: Always``; ``container``: a plain
    container; ``auto``: native when ``kubernetes_version`` >= ``native_min_version``."""
    kubernetes_version: str | None = None
    """The cluster's version (``kubectl version``: Server Version) for ``auto``."""
    native_min_version: str = "1.29"
    """First version where native sidecars are on by default (beta in 1.29)."""
    unknown_version_mode: Literal["native", "container"] = "container"
    """``auto`` without ``kubernetes_version``: plain container works on every version."""

    @model_validator(mode="after")
    def _tls_pair(self) -> InjectorConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both or neither")
        return self

    @model_validator(mode="after")
    def _distinct_ports(self) -> InjectorConfig:
        if self.grpc_port == self.http_port:
            raise ValueError("grpc_port and http_port must differ (one listener each)")
        return self

    @field_validator("app_env")
    @classmethod
    def _no_otlp_destination(cls, value: dict[str, str]) -> dict[str, str]:
        derived = sorted(set(value) & DERIVED_VARIABLES)
        if derived:
            raise ValueError(
                f"{', '.join(derived)}: the injector derives the OTLP endpoint and protocol "
                "from otlp_protocol, grpc_port and http_port (and keeps an app's own); "
                "remove them from app_env"
            )
        return value

    @field_validator("kubernetes_version", "native_min_version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None:
            parse_version(value)
        return value

    def native_sidecar(self) -> bool:
        """Whether pods get the sidecar as a native sidecar (the version rule)."""
        if self.sidecar_mode != "auto":
            return self.sidecar_mode == "native"
        if self.kubernetes_version is None:
            return self.unknown_version_mode == "native"
        return parse_version(self.kubernetes_version) >= parse_version(self.native_min_version)


class InjectorConfigError(ConfigError):
    """The injector's configuration could not be loaded; ``errors`` lists every problem."""

    header = "invalid injector configuration"


def load_injector_config(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> InjectorConfig:
    """Merge defaults < file < environment < ``overrides`` (flags), validate once.

    Raises :class:`InjectorConfigError` listing every error with its key path.
    """
    return load_layers(
        InjectorConfig,
        prefix=ENV_PREFIX,
        environ=os.environ if environ is None else environ,
        config_file=config_file,
        overrides=overrides,
        # A partial nested section (``resources.limits.cpu``) keeps its siblings' defaults.
        onto_defaults=True,
        error=InjectorConfigError,
    )


__all__ = [
    "ENV_PREFIX",
    "InjectorConfig",
    "InjectorConfigError",
    "load_injector_config",
    "parse_version",
    "split_host_port",
]
