"""OTLP receivers: gRPC and HTTP (protobuf and JSON)."""
