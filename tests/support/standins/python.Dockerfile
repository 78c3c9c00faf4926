# Stand-in for python:3.13-bookworm and python:3.13-slim-bookworm (test tooling, never
# pushed, never used outside the tests): Debian trixie's own Python 3.13 on a base made by
# debootstrap, since no registry image can be pulled here. Differences from the real
# images are listed in docs/testing.md (Debian's 3.13.x build in /usr/bin, not a
# python.org build in /usr/local; trixie userland, not bookworm; no compilers).
FROM gym-telemetry-base/debian:trixie
# The machine's extra CA certificates (a TLS-inspecting proxy's), so that pip and uv
# inside image builds reach the package index; the real images need none.
COPY ca-certificates/ /usr/local/share/ca-certificates/
# Debian's pip refuses to replace Debian-installed packages (no RECORD file), which a
# big `pip install` as root then trips over: like the real image, the interpreter pip
# installs into has a site-packages of its own, here a virtualenv made from Debian's
# Python, first on PATH.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/python \
    && ln -s /opt/python/bin/python /opt/python/bin/pip /opt/python/bin/pip3 /usr/local/bin/
ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8
CMD ["python3"]
