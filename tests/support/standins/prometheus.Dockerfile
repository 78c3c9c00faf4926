# Stand-in for the prom/prometheus tag docker-compose.yml pins (test tooling): Debian
# trixie's prometheus package, laid out like the real image (entrypoint /bin/prometheus,
# user nobody, working and storage directory /prometheus, the same default arguments).
# Differences (docs/testing.md): Debian's build of its own 2.x release, not the exact
# pinned patch release; Debian's web assets.
FROM gym-telemetry-base/debian:trixie
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* \
    && test -x /bin/prometheus \
    && install -d -o nobody -g nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
