"""The sidecar's pipeline: receive -> enrich -> derive -> gate -> queue -> export.

Derive runs before gate so that span groups in ``metrics`` mode still feed the derived
metrics before the gate drops their spans. Assembly: :mod:`gym_sidecar.pipeline.build`.
"""
