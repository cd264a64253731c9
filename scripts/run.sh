#!/usr/bin/env bash
# The run command: start the local stack (Kafka + Postgres, idempotent), then the processor and
# the HTTP API. Ctrl-C (or SIGTERM) stops both gracefully.
#
#   VITALS_API_TOKENS=ops:admin:<secret>,gw:writer:<secret> scripts/run.sh
#
# Flags after `--api` go to the API, the others to the processor (see each one's --help).
# With VITALS_PROBER_CONFIG set (a targets file, e.g. deploy/prober/targets.toml), the prober
# runs too.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
proc_args=()
api_args=()
target=proc
for a in "$@"; do
  if [[ "$a" == "--api" ]]; then target=api; continue; fi
  if [[ $target == proc ]]; then proc_args+=("$a"); else api_args+=("$a"); fi
done
scripts/install-deps.sh demo   # the build and the stack: what the demo needs without its gateway
scripts/stack.sh up
export VITALS_KAFKA_BROKERS=${VITALS_KAFKA_BROKERS:-127.0.0.1:${VITALS_KAFKA_PORT:-9092}}
export VITALS_DATABASE_URL=${VITALS_DATABASE_URL:-postgres://${VITALS_PG_USER:-vitals}:${VITALS_PG_PASSWORD:-vitals}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
cargo build --release -p vitals-processor -p vitals-api -p vitals-prober
target/release/vitals-processor "${proc_args[@]}" &
proc_pid=$!
# The processor creates the topics; the API waits for nothing but they should exist first.
for _ in $(seq 1 100); do
  (exec 3<>/dev/tcp/127.0.0.1/9464) 2>/dev/null && break
  kill -0 "$proc_pid" 2>/dev/null || { echo "[run] the processor exited" >&2; exit 1; }
  sleep 0.2
done
# The API reads with the read-only role (docs/operations.md, "Database roles").
reader_url=${VITALS_API_DATABASE_URL:-postgres://${VITALS_PG_READER_USER:-vitals_reader}:${VITALS_PG_READER_PASSWORD:-vitals_reader}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
MALLOC_MMAP_THRESHOLD_=131072 target/release/vitals-api --database-url "$reader_url" "${api_args[@]}" &
api_pid=$!
pids=("$proc_pid" "$api_pid")
if [[ -n "${VITALS_PROBER_CONFIG:-}" ]]; then
  target/release/vitals-prober &
  pids+=("$!")
  echo "[run] prober: http://127.0.0.1:9465/metrics (targets: $VITALS_PROBER_CONFIG)" >&2
fi
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait' INT TERM EXIT
echo "[run] processor: http://127.0.0.1:9464/metrics   api: http://127.0.0.1:8080/v1/openapi.json" >&2
wait -n "${pids[@]}"
