#!/usr/bin/env bash
# The run command: start the local stack (Kafka + Postgres, idempotent) and the processor in the
# foreground. Extra arguments go to the processor (see `--help`); Ctrl-C stops it gracefully.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
scripts/install-deps.sh
scripts/stack.sh up
export VITALS_KAFKA_BROKERS=${VITALS_KAFKA_BROKERS:-127.0.0.1:${VITALS_KAFKA_PORT:-9092}}
export VITALS_DATABASE_URL=${VITALS_DATABASE_URL:-postgres://${VITALS_PG_USER:-vitals}:${VITALS_PG_PASSWORD:-vitals}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
exec cargo run --release -p vitals-processor -- "$@"
