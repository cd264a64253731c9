# Builds the vitals services. Used by docker-compose.yaml; not needed for the native scripts.
FROM rust:1.88-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake libcurl4-openssl-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p vitals-processor -p vitals-api -p vitals-prober -p vitals-upstream-sim \
    -p vitals-router -p vitals-demo -p vitals-alerter -p vitals-cli -p vitals-otlp

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 libcurl4 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/vitals-processor /src/target/release/vitals-api \
    /src/target/release/vitals-prober /src/target/release/vitals-upstream-sim \
    /src/target/release/vitals-router /src/target/release/vitals-demo \
    /src/target/release/vitals-alerter /src/target/release/vitals /src/target/release/vitals-otlp /usr/local/bin/
COPY deploy /etc/vitals/deploy
USER nobody
ENTRYPOINT ["/usr/local/bin/vitals-processor"]
