#!/usr/bin/env bash
# vitals' topics with kcat (any Kafka client works: the records are plain Avro single-object
# encoded bytes, the schemas are in schemas/).
#
#   examples/kcat.sh topics                      # the topics and their partitions
#   examples/kcat.sh tail-changes [N]            # the last N changes: key (pool/endpoint), time, size
#   examples/kcat.sh states                      # the compacted state: one record per endpoint
#   examples/kcat.sh report FILE POOL            # send a CallOutcome encoded in FILE, keyed by POOL
#
# VITALS_KAFKA_BROKERS (default 127.0.0.1:9092) and the VITALS_*_TOPIC variables choose where.
set -euo pipefail
B=${VITALS_KAFKA_BROKERS:-127.0.0.1:9092}
SIGNALS=${VITALS_SIGNALS_TOPIC:-vitals.signals.v1}
CHANGES=${VITALS_CHANGES_TOPIC:-vitals.health-changes.v1}
STATE=${VITALS_STATE_TOPIC:-vitals.health-state.v1}
case "${1:-}" in
  topics)
    kcat -b "$B" -L | grep -E "topic \"vitals\." ;;
  tail-changes)
    # -o -N: the last N of each partition; -e: exit at the end. Keys are pool/endpoint (the
    # order of one endpoint's transitions is kept).
    kcat -b "$B" -C -t "$CHANGES" -o "-${2:-10}" -e -q -f 'key=%k partition=%p offset=%o time=%T bytes=%S\n' ;;
  states)
    # The compacted topic's key is pool/endpoint: its latest record is the endpoint's state.
    kcat -b "$B" -C -t "$STATE" -o beginning -e -q -f '%k %S bytes\n' | sort -u ;;
  report)
    # The file holds one single-object encoded record (e.g. from examples/python/vitals_avro.py).
    kcat -b "$B" -P -t "$SIGNALS" -k "$3" -X enable.idempotence=true "$2"
    echo "sent $(stat -c %s "$2") bytes to $SIGNALS keyed by $3" ;;
  *)
    sed -n '2,11p' "$0"; exit 2 ;;
esac
