"""Metrics derived from rollout and verify spans."""
