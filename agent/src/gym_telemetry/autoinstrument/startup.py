"""Imported by the ``gym_telemetry_autoinstrument.pth`` line at interpreter start-up.

It activates auto-instrumentation when ``GYM_TELEMETRY`` asks for it and does nothing
else. The ``.pth`` line imports this module only when the variable is present at all.
"""

from __future__ import annotations

from gym_telemetry.autoinstrument import activate, activation_requested

if activation_requested():
    activate()
