"""HTTP/2 (``h2``) and gRPC over it, for the receiver (server) and the exporter (client)."""
