"""``python -m gym_telemetry_demo`` (``make demo``): the whole product on one machine.

Real NeMo Gym servers, auto-instrumented, send their spans to a real sidecar that
writes them into the embedded local store; the demo drives rollouts (a few with a
verifier that fails on purpose) and prints the rollouts table, one waterfall and the
stats with the same code as ``gym-sidecar rollouts|trace|stats``.

- :mod:`.gym_servers`: start/stop real Gym servers the way Gym's launcher does;
- :mod:`.sidecar`: a ``gym-sidecar run`` child process;
- :mod:`.run`: the demo's steps; :mod:`.__main__`: its command line.
"""
