"""Export: the bounded queue, batching, retry and the OTLP exporters to the backend."""
