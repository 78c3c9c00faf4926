# Stand-in for python:3.13-bookworm and python:3.13-slim-bookworm (test tooling, never
# pushed, never used outside the tests): Debian trixie's own Python 3.13 on a base made by
# debootstrap, since no registry image can be pulled here. Differences from the real
# images are listed in docs/testing.md (Debian's 3.13.x build in /usr/bin, not a
# python.org build in /usr/local; trixie userland, not bookworm; no compilers).
FROM gym-telemetry-base/debian:trixie
# The machine's extra CA certificates (a TLS-inspecting proxy's), so that pip and uv
# inside image builds reach the package index; the real images need none.
COPY ca-certificates/ /usr/local/share/ca-certificates/
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip python3-venv python-is-python3 \
    && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/bin/pip3 /usr/local/bin/pip
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8
CMD ["python3"]
