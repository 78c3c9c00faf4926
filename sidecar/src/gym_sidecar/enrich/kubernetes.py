"""The Kubernetes source: pod metadata from the downward API.

Two inputs, both set up by the injection webhook (names pinned in ``downward_api``):

- environment variables ``K8S_POD_NAME``, ``K8S_POD_UID``, ``K8S_NAMESPACE_NAME``,
  ``K8S_NODE_NAME``, ``K8S_CONTAINER_NAME`` -> ``k8s.pod.name``, ... (empty ones skipped);
- files ``labels`` and ``annotations`` of a downwardAPI volume (one ``key="value"`` line
  per entry, the value quoted with Go escapes) -> ``k8s.pod.label.<key>`` and
  ``k8s.pod.annotation.<key>`` for the configured keys only.

Read once at startup. A missing directory or file is normal outside Kubernetes and adds
nothing; a malformed line is skipped with a warning naming the file and line.
"""

from __future__ import annotations

import ast
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from gym_sidecar.core import downward_api
from gym_sidecar.enrich.attributes import AttributeValue
from gym_sidecar.enrich.config import KubernetesConfig
from gym_sidecar.enrich.keys import K8S_POD_ANNOTATION_PREFIX, K8S_POD_LABEL_PREFIX

logger = logging.getLogger(__name__)

_LINE = re.compile(r'^([^=\s]+)=(".*")$')


class PodinfoFormatError(ValueError):
    """A line of a downward-API file is not ``key="quoted value"``."""


def parse_podinfo(text: str, source: str = "<podinfo>") -> dict[str, str]:
    """Parse a downward-API labels/annotations file into a dict.

    Malformed lines are skipped with a warning (one bad annotation must not cost the
    rest). Quoted values use Go escapes, which Python string literals cover
    (``\\"``, ``\\\\``, ``\\n``, ``\\t``, ``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``).
    """
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            key, value = _parse_line(line)
        except PodinfoFormatError as exc:
            logger.warning("%s line %d skipped: %s", source, lineno, exc)
            continue
        out[key] = value
    return out


def _parse_line(line: str) -> tuple[str, str]:
    match = _LINE.match(line)
    if match is None:
        raise PodinfoFormatError(f'not key="value": {line[:80]!r}')
    try:
        value = ast.literal_eval(match.group(2))
    except (ValueError, SyntaxError) as exc:
        raise PodinfoFormatError(f"bad quoted value: {match.group(2)[:80]!r}") from exc
    if not isinstance(value, str):
        raise PodinfoFormatError(f"value is not a string: {match.group(2)[:80]!r}")
    return match.group(1), value


def podinfo_dir(cfg: KubernetesConfig, environ: Mapping[str, str]) -> Path:
    """The downward-API volume directory: config, else ``$GYM_SIDECAR_PODINFO_DIR``,
    else ``/etc/podinfo``."""
    if cfg.podinfo_dir:
        return Path(cfg.podinfo_dir)
    return Path(environ.get(downward_api.PODINFO_DIR_ENV) or downward_api.PODINFO_DEFAULT_DIR)


def _read_file(path: Path, max_bytes: int) -> str | None:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            logger.warning("%s ignored: %d bytes > max_file_bytes %d", path, size, max_bytes)
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("cannot read %s: %s", path, exc)
        return None


def kubernetes_attributes(
    cfg: KubernetesConfig, environ: Mapping[str, str] | None = None
) -> dict[str, AttributeValue]:
    """The pod's attributes from the environment and the podinfo files (blocking file
    reads; call at startup, not on the event loop's hot path)."""
    if not cfg.enabled:
        return {}
    env = os.environ if environ is None else environ
    out: dict[str, AttributeValue] = {}
    for var, key in downward_api.ENV_TO_ATTRIBUTE.items():
        value = env.get(var, "").strip()
        if value:
            out[key] = value
    directory = podinfo_dir(cfg, env)
    for filename, prefix, wanted in (
        (downward_api.PODINFO_LABELS_FILE, K8S_POD_LABEL_PREFIX, cfg.labels),
        (downward_api.PODINFO_ANNOTATIONS_FILE, K8S_POD_ANNOTATION_PREFIX, cfg.annotations),
    ):
        if not wanted:
            continue
        path = directory / filename
        text = _read_file(path, cfg.max_file_bytes)
        if text is None:
            continue
        entries = parse_podinfo(text, str(path))
        for name in wanted:
            if name in entries:
                out[prefix + name] = entries[name]
    return out
