# The gateway Collector (tier 1 and tier 2 of deploy/gateway) as an image. The binary is
# the project's distribution built on the host by scripts/otelcol_build.py (from
# deploy/gateway/otelcol-builder.yaml), passed in as the named build context
# `gateway-bin` (its bin/ directory):
#   docker buildx build -f deploy/docker/gateway.Dockerfile \
#     --build-context gateway-bin="$(dirname "$(python3 scripts/otelcol_build.py path)")" \
#     -t gym-gateway:0.161.0-gym.1 .
# deploy/compose/gateway.yaml does the same through build.additional_contexts.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# gateway-bin is a named build context (--build-context / additional_contexts), not a
# stage of this file, which hadolint cannot know.
# hadolint ignore=DL3022
COPY --from=gateway-bin otelcol-gym-gateway /usr/local/bin/otelcol-gym-gateway
COPY deploy/gateway/tier1.yaml deploy/gateway/tier1-dns.yaml deploy/gateway/tier2.yaml /etc/gym-gateway/
USER 10001:10001
EXPOSE 4317 4318 13133 8888
ENTRYPOINT ["/usr/local/bin/otelcol-gym-gateway"]
CMD ["--config", "/etc/gym-gateway/tier2.yaml"]
