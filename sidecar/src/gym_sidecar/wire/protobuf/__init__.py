"""OTLP request bodies on the wire: protobuf (and its JSON mapping) decoded with bounds,
and the trace scanner (pure Python, or the native ``gym_sidecar_native``)."""
