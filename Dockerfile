# The vitals images, from one multi-stage build:
#   docker build -t vitals .                          # every service binary (the default target)
#   docker build --target litellm -t vitals-litellm . # LiteLLM with the vitals plug-in
# The runtime image runs as a non-root user (10001), needs no shell (every entrypoint is exec form)
# and writes nothing outside the volumes a deployment mounts, so it runs with a read-only root file
# system (deploy/helm/vitals sets it). docker-compose.yaml and the Helm chart use it.
#
# This machine's CI has no Docker engine: scripts/check-image.py lints this file with hadolint and
# runs the build stage's exact cargo invocation on the files its COPY takes, then checks that every
# binary the runtime stage copies exists and finds its shared libraries in the runtime's packages.

FROM rust:1.95-bookworm AS build
# cmake builds librdkafka; libssl-dev gives it TLS; libcurl's headers its OAUTHBEARER/OIDC support.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends cmake libcurl4-openssl-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# .dockerignore keeps out target/, .git/ and local state; everything cargo reads comes in.
COPY . .
RUN cargo build --release --locked -p vitals-processor -p vitals-api -p vitals-prober -p vitals-otlp -p vitals-merger -p vitals-xds -p vitals-alerter -p vitals-router -p vitals-haproxy -p vitals-logbridge -p vitals-cli -p vitals-upstream-sim -p vitals-demo

FROM python:3.11-slim-bookworm AS litellm
# LiteLLM at the version the plug-in is tested with, its proxy's extras, and the plug-in.
COPY integrations/litellm /src/vitals-litellm
RUN pip install --no-cache-dir "/src/vitals-litellm[proxy]" && rm -rf /src/vitals-litellm \
    && useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vitals
USER 10001:10001
ENTRYPOINT ["litellm"]
CMD ["--config", "/etc/litellm/config.yaml", "--port", "4000"]

# The default target (the last stage): every service binary.
FROM debian:bookworm-slim AS runtime
# The binaries link glibc, zlib and OpenSSL (librdkafka's curl support is built in without
# linking libcurl); ca-certificates verifies Kafka's, Postgres' and Alertmanager's TLS peers.
# scripts/check-image.py holds every library the binaries load against these packages.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 vitals \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vitals
COPY --from=build /src/target/release/vitals-processor /src/target/release/vitals-api \
    /src/target/release/vitals-prober /src/target/release/vitals-otlp \
    /src/target/release/vitals-merger /src/target/release/vitals-xds /src/target/release/vitals-alerter \
    /src/target/release/vitals-router /src/target/release/vitals-haproxy \
    /src/target/release/vitals-logbridge /src/target/release/vitals \
    /src/target/release/vitals-upstream-sim /src/target/release/vitals-demo /usr/local/bin/
# The example configurations (targets, maps, routes) that docker-compose.yaml mounts or names.
COPY deploy /etc/vitals/deploy
# glibc's allocator raises its mmap threshold as large blocks are freed, after which a crowd of
# live streams' buffers (librdkafka's fetches) stays in the heap once they end: fixed at 128 KiB,
# large blocks go back to the system when freed (sse-bench --resume-flood: 23 % of what 64
# far-back streams took stayed, 34 % without; docs/operations.md).
ENV MALLOC_MMAP_THRESHOLD_=131072
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/vitals-processor"]
