#!/usr/bin/env bash
# The quick loop a contributor runs every minute: every test that needs neither the local stack
# (Kafka, Postgres) nor the peers scripts/install-deps.sh installs — plain `cargo test`, since
# the tests that do need them sit behind each package's `stack` feature, which scripts/test.sh
# (the whole suite, and what CI runs) turns on. Arguments go to `cargo test` (e.g. a name filter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --release --workspace "$@"
