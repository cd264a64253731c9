#!/usr/bin/env bash
# The test command: brings up the local stack (Kafka + Postgres, idempotent) and runs the whole
# suite against it — unit, property, scenario and integration tests.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# What the build and the tests need (system packages, the Python peers): quick when present.
scripts/install-deps.sh
scripts/stack.sh up
if command -v docker-compose >/dev/null; then
  docker-compose -f docker-compose.yaml config -q && echo "[test] docker-compose.yaml is valid" >&2
fi
export VITALS_TEST_KAFKA=${VITALS_TEST_KAFKA:-127.0.0.1:${VITALS_KAFKA_PORT:-9092}}
export VITALS_TEST_DATABASE_URL=${VITALS_TEST_DATABASE_URL:-postgres://${VITALS_PG_USER:-vitals}:${VITALS_PG_PASSWORD:-vitals}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
export VITALS_TEST_READER_DATABASE_URL=${VITALS_TEST_READER_DATABASE_URL:-postgres://${VITALS_PG_READER_USER:-vitals_reader}:${VITALS_PG_READER_PASSWORD:-vitals_reader}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
# The property tests (proptest) draw their cases from this seed, so that the command decides the
# same on every run and a failure replays (each `*.proptest-regressions` file's cases first).
# Another number draws other cases: `PROPTEST_RNG_SEED=$RANDOM scripts/test.sh`.
export PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-20261204}
status=0
# `--features stack` turns on the tests that need the stack and the peers (without it, `cargo test`
# runs the rest on any machine: scripts/quick-test.sh).
cargo test --workspace --release --no-fail-fast --features stack "$@" || status=$?
# The container image and the Helm chart, on the binaries just built (no Docker engine or cluster
# needed: scripts/check-deploy.sh says how).
scripts/check-deploy.sh || status=$?
# The LiteLLM plug-in's own tests, in LiteLLM's virtual environment (scripts/install-deps.sh).
venv=${VITALS_LITELLM_VENV:-/opt/vitals-litellm-venv}
(cd integrations/litellm/tests && LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/python" -m pytest -q -p no:warnings -p no:cacheprovider) || status=$?
exit $status
