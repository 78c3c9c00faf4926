"""A span per MCP tool call on Gym's auto-exposed ``/mcp`` endpoint.

Gym 0.7.0's MCP auto-exposure (``nemo_gym.mcp_auto_exposure``, a resources server with
``expose_tools_over_mcp: true``) serves its tool routes over one ``POST /mcp`` route
that is not added through ``add_api_route``. Each ``tools/call`` invokes the tool's
route handler directly (``call_direct``), past the app's middleware, so the request has
one SERVER span (``POST /mcp``) and nothing says which tool ran.

``patch_mcp_auto_exposure`` replaces the module's ``call_direct`` (looked up by name at
call time from the ``tools/call`` handler) with a wrapper that records, in group
``server`` (the group of the SERVER span a tool route gets over plain HTTP):

- name ``tools/call <tool>``, kind INTERNAL, child of the ``POST /mcp`` SERVER span
  (so it joins the caller's trace and carries the rollout id the SERVER layer restored);
- ``mcp.method.name=tools/call``, ``gen_ai.operation.name=execute_tool``,
  ``gen_ai.tool.name=<tool>`` (OpenTelemetry's MCP and GenAI conventions);
- the tool name is the catch-all path value when the tool is bound to one, else the
  route path without its leading ``/`` (the name Gym advertises for a harvested route);
- a failed dispatch (``DirectDispatchError``: the handler's 4xx/5xx, a validation
  error) or any exception: status ERROR, ``error.type`` = the exception's type.

Arguments and results are never recorded (they are task content). Gated per call; with
group ``server`` off the call runs unwrapped. Never raises into the tool call.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_telemetry import span_groups

_log = logging.getLogger(__name__)

SPAN_PREFIX: Final = "tools/call"
MCP_METHOD_NAME: Final = "mcp.method.name"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
_PATCHED: Final = "_gym_telemetry_patched"
_ENABLED: Final = span_groups.ENABLED
_GROUP: Final = semconv.GROUP_SERVER


def tool_name(binding: Any, path_value: str | None) -> str:
    """The tool a direct dispatch runs: the catch-all value, else the route path."""
    if path_value:
        return str(path_value)
    path = getattr(binding, "path", None)
    return str(path).lstrip("/") if isinstance(path, str) and path else "unknown"


def patch_mcp_auto_exposure(module: ModuleType) -> None:
    """Wrap ``module.call_direct`` (module doc). Idempotent."""
    from gym_telemetry.autoinstrument.gym_primitives import managed_span

    original = getattr(module, "call_direct", None)
    if original is None or getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    async def call_direct(
        app: Any,
        binding: Any,
        session_id: str,
        arguments: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if _GROUP not in _ENABLED.groups:
            return await original(app, binding, session_id, arguments, *args, **kwargs)
        try:
            name = tool_name(binding, kwargs.get("path_value", args[0] if args else None))
            span_cm = managed_span(
                _GROUP,
                f"{SPAN_PREFIX} {name}",
                **{
                    MCP_METHOD_NAME: SPAN_PREFIX,
                    GEN_AI_OPERATION_NAME: "execute_tool",
                    GEN_AI_TOOL_NAME: name,
                },
            )
            span_cm.__enter__()
        except Exception:  # telemetry must never break the tool call
            _log.debug("gym_telemetry: could not start an MCP tool span", exc_info=True)
            return await original(app, binding, session_id, arguments, *args, **kwargs)
        try:
            result = await original(app, binding, session_id, arguments, *args, **kwargs)
        except BaseException as exc:
            span_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        span_cm.__exit__(None, None, None)
        return result

    setattr(call_direct, _PATCHED, True)
    module.call_direct = call_direct  # type: ignore[attr-defined]
