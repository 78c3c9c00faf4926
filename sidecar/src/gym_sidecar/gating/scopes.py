"""Which span group an instrumentation scope belongs to.

The scopes of Gym's two producers are ``core.producers``' to say: gym_telemetry's own
(``semconv.scope_name(group)``, one per group) and Gym's own telemetry's (``nemo.gym``
for its CLIENT hops; ``nemo.lens.helpers`` carries every group, so it has no group of its
own and the gate reads it span by span, ``ScopeRole.by_name``). Third-party
instrumentations that Gym processes run are mapped by the table below (plus
``span_groups.scope_groups`` from the config). Scopes that map to no group are never
gated: the gate only drops what it can name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import gym_telemetry_semconv as semconv

from gym_sidecar.core import producers

#: Built-in third-party scope -> group table.
THIRD_PARTY_SCOPES: Final[Mapping[str, str]] = {
    # FastAPI's own telemetry (fastapi >= 0.165, fastapi/telemetry/_asgi.py: get_tracer("fastapi"))
    "fastapi": semconv.GROUP_SERVER,
    # opentelemetry-instrumentation-fastapi / -asgi / -starlette: the SERVER span per request
    "opentelemetry.instrumentation.fastapi": semconv.GROUP_SERVER,
    "opentelemetry.instrumentation.asgi": semconv.GROUP_SERVER,
    "opentelemetry.instrumentation.starlette": semconv.GROUP_SERVER,
    # opentelemetry-instrumentation-aiohttp-client: the CLIENT span per hop between servers
    "opentelemetry.instrumentation.aiohttp_client": semconv.GROUP_HTTP_CLIENT,
}


class ScopeMap:
    """Scope name -> group (or None), memoised; bounded by ``max_entries``; and for a
    scope that carries several groups, its per-span-name answer (:meth:`split`).

    Lookups are cached because the same few scope names arrive in every batch. Past
    ``max_entries`` distinct names (a misbehaving client inventing scopes), answers are
    computed without being cached.
    """

    def __init__(self, extra: Mapping[str, str] | None = None, max_entries: int = 1024) -> None:
        self._table: dict[str, str] = dict(THIRD_PARTY_SCOPES)
        if extra:
            self._table.update(extra)
        self._cache: dict[str, str | None] = {}
        self._max_entries = max_entries

    def group(self, scope: str) -> str | None:
        """The span group of ``scope``, or None when it belongs to no known group."""
        try:
            return self._cache[scope]
        except KeyError:
            pass
        role = producers.scope_role(scope)
        group = role.group
        if role.producer is not producers.Producer.AGENT:
            group = self._table.get(scope, group)
        if len(self._cache) < self._max_entries:
            self._cache[scope] = group
        return group

    def split(self, scope: str) -> producers.ScopeRole | None:
        """The role that names the group of each span of ``scope`` when the scope carries
        several groups (``nemo.lens.helpers``) and the config does not map it to one;
        None for every other scope. Only asked for scopes :meth:`group` maps to None."""
        role = producers.scope_role(scope)
        if role.by_name and scope not in self._table:
            return role
        return None
