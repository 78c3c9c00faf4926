"""Span-group gating: the fleet-wide configuration, its API for agents, enforcement."""
