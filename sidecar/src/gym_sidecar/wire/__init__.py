"""The sidecar's wire layer: the protocols it speaks itself, one subpackage each.

- :mod:`.http2`: HTTP/2 on ``h2`` and gRPC over it: the ``h2`` connection both gRPC
  ends use (:mod:`.http2.connection`), the frame-header guard (:mod:`.http2.guard`), the
  gRPC server connection (:mod:`.http2.grpc_server`) and a call's gRPC checks
  (:mod:`.http2.grpc_call`);
- :mod:`.http1`: the HTTP/1.1 server on ``httptools`` (ASGI apps, with limits);
- :mod:`.protobuf`: OTLP request bodies on the wire: decoding with bounds
  (:mod:`.protobuf.decode`, :mod:`.protobuf.bounds`) and the trace scanner, the Python
  face of the native one (:mod:`.protobuf.scan`).

The layer imports the sidecar's leaves, core
and configuration only; the receivers, the exporters and the web listeners import it.
"""
