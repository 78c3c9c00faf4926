"""The sidecar's wire layer: the protocols it speaks itself, one subpackage each.

- :mod:`.http2`: HTTP/2 on ``h2`` and gRPC over it. Shared by both gRPC ends: the
  ``h2`` connection (:mod:`.http2.connection`) and gRPC's framing on a stream
  (:mod:`.http2.grpc_framing`: the message prefix, compression, ``grpc-timeout``). The
  server (the receiver's): one connection (:mod:`.http2.grpc_server`), a call's checks
  (:mod:`.http2.grpc_call`), the frame-header guard (:mod:`.http2.guard`). The client
  (the exporter's): :mod:`.http2.grpc_client`;
- :mod:`.http1`: the HTTP/1.1 server on ``httptools`` (ASGI apps, with limits);
- :mod:`.protobuf`: OTLP request bodies on the wire: decoding with bounds
  (:mod:`.protobuf.decode`, :mod:`.protobuf.bounds`) and the trace scanner, the Python
  face of the native one (:mod:`.protobuf.scan`).
- :mod:`.linger`: the lingering close both listeners use, so that the last answer
  written before a close (a GOAWAY, a 400) reaches the client.

Why each protocol is the sidecar's own rather than a library's, and which conformance
suite guards it: ``README.md`` beside this file.

The layer imports the sidecar's leaves, core
and configuration only; the receivers, the exporters and the web listeners import it.
"""
