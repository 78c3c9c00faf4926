# Stand-in for jaegertracing/jaeger:2.13.0 (test tooling): the binary that
# scripts/jaeger_build.py builds from Go module v1.76.0 (= release 2.13.0), laid out like
# the real image (cmd/jaeger/Dockerfile of that release): same path, entrypoint, user and
# JAEGER_LISTEN_HOST. Differences (docs/testing.md): built from the module, so no UI
# assets (the query API on 16686 works, the web pages do not); a Debian trixie base
# instead of Alpine.
FROM gym-telemetry-base/debian:trixie
ENV JAEGER_LISTEN_HOST=0.0.0.0
COPY jaeger /cmd/jaeger/jaeger-linux
EXPOSE 4317 4318 5778 5779 9411 13133 14250 14268 16686
VOLUME ["/tmp"]
USER 10001
ENTRYPOINT ["/cmd/jaeger/jaeger-linux"]
