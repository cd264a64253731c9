#!/usr/bin/env python3
"""Report a gateway's calls to vitals from Python: CallOutcome records, Avro single-object
encoded, keyed by pool, on the signals topic (confluent-kafka + fastavro).

  python3 examples/python/report_calls.py --pool chat --endpoint chat-a --outcome CONNECT_ERROR --count 20

In a gateway, call `report(...)` from the request path: `produce` only queues the record, and a
full local queue drops the report (counted) instead of failing the call.
"""
import argparse
import time
import uuid

from confluent_kafka import Producer

from vitals_avro import Schema

CALL = Schema("call_outcome.avsc")


def call_outcome(pool, endpoint, outcome, latency_ms, ttft_ms=None, http_status=None, model=None):
    return {
        "event_id": str(uuid.uuid4()),
        "pool": pool,
        "endpoint": endpoint,
        "gateway": "python-example",
        "occurred_at": int(time.time() * 1_000_000),
        "outcome": outcome,
        "http_status": http_status,
        "latency_us": int(latency_ms * 1000),
        "ttft_us": None if ttft_ms is None else int(ttft_ms * 1000),
        "tpot_us": None,
        "attributes": {"route": "/v1/chat/completions"},
        "model": model,
        "retry_after_ms": None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--topic", default="vitals.signals.v1")
    ap.add_argument("--pool", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--outcome", default="SUCCESS",
                    choices=["SUCCESS", "TIMEOUT", "CONNECT_ERROR", "CONNECTION_DROPPED", "RATE_LIMITED",
                             "SERVER_ERROR", "CLIENT_ERROR", "INVALID_RESPONSE", "CANCELLED"])
    ap.add_argument("--count", type=int, default=1)
    args = ap.parse_args()

    failed = []
    producer = Producer({
        "bootstrap.servers": args.brokers,
        "enable.idempotence": True,   # no duplicates on retries
        "linger.ms": 5,
        "compression.type": "lz4",
    })

    def delivered(err, _msg):
        if err is not None:
            failed.append(err)

    for _ in range(args.count):
        status = {"SUCCESS": 200, "SERVER_ERROR": 503, "RATE_LIMITED": 429, "CLIENT_ERROR": 400}.get(args.outcome)
        record = call_outcome(args.pool, args.endpoint, args.outcome, latency_ms=120, ttft_ms=80 if status == 200 else None,
                              http_status=status, model="example-model")
        try:
            producer.produce(args.topic, key=args.pool.encode(), value=CALL.encode(record), on_delivery=delivered)
        except BufferError:
            failed.append("local queue full")  # a gateway drops the report, never the call
        producer.poll(0)
    left = producer.flush(10)
    if failed or left:
        raise SystemExit(f"{len(failed) + left} of {args.count} reports not delivered: {failed[:3]}")
    print(f"delivered {args.count} {args.outcome} reports for {args.pool}/{args.endpoint} to {args.topic}")


if __name__ == "__main__":
    main()
