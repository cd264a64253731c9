#!/usr/bin/env bash
# HTTP ingest, for a gateway that cannot reach Kafka: POST a JSON batch of calls (and probes) to
# the API's /v1/signals with a writer token. Every item gets a status: accepted (on the topic,
# confirmed by the broker), rejected (invalid: the field and why) or failed (send it again).
#
#   VITALS_API=http://127.0.0.1:8080 VITALS_TOKEN=<writer secret> examples/curl-ingest.sh POOL ENDPOINT
set -euo pipefail
API=${VITALS_API:-http://127.0.0.1:8080}
: "${VITALS_TOKEN:?set VITALS_TOKEN to a writer token (see the --token flag of vitals-api: name:writer:SECRET)}"
POOL=${1:?pool}
ENDPOINT=${2:?endpoint}
curl -sS --fail-with-body -X POST "$API/v1/signals" \
  -H "authorization: Bearer $VITALS_TOKEN" -H 'content-type: application/json' \
  -d @- <<JSON
{"items": [
  {"type": "call", "pool": "$POOL", "endpoint": "$ENDPOINT", "gateway": "curl-example",
   "outcome": "success", "http_status": 200, "latency_us": 180000, "ttft_us": 90000, "model": "example-model"},
  {"type": "call", "pool": "$POOL", "endpoint": "$ENDPOINT", "gateway": "curl-example",
   "outcome": "server_error", "http_status": 503, "latency_us": 40000, "retry_after_ms": 2000},
  {"type": "probe", "pool": "$POOL", "endpoint": "$ENDPOINT", "prober": "curl-example",
   "kind": "http", "outcome": "success", "http_status": 200, "latency_us": 12000, "interval_ms": 5000},
  {"type": "call", "pool": "$POOL", "endpoint": "$ENDPOINT", "gateway": "curl-example",
   "outcome": "no_such_outcome", "latency_us": 1}
]}
JSON
echo
