"""The sidecar's pipeline: receive -> enrich -> gate -> derive -> queue -> export."""
