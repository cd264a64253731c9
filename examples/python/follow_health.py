#!/usr/bin/env python3
"""Follow vitals' health from Python: the current state of every endpoint from the compacted
state topic, then every transition and pool decision from the changes topic, one line each
(confluent-kafka + fastavro).

  python3 examples/python/follow_health.py                 # until Ctrl-C
  python3 examples/python/follow_health.py --max 5         # stop after 5 changes

A router keeps the latest `weight` per (pool, endpoint) and picks by it; `seq` grows by one per
endpoint, so a duplicate (seq already seen) is dropped and a jump means changes were missed.
"""
import argparse
import sys
import time

from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING, OFFSET_END

from vitals_avro import by_fingerprint, decode_any

# A fleet-wide transition is written in HealthChanged version 1, a scoped one (for one gateway,
# location or credential only) in version 2; pool events likewise.
SCHEMAS = by_fingerprint(
    "health_changed.avsc", "health_changed.v1.avsc", "pool_health_changed.avsc", "pool_health_changed.v1.avsc",
    "endpoint_state.avsc",
)


def consumer(brokers):
    return Consumer({
        "bootstrap.servers": brokers,
        "group.id": "python-health-follower",  # offsets are not committed: positions are explicit
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })


def partitions(c, topic):
    md = c.list_topics(topic, timeout=10)
    if topic not in md.topics or md.topics[topic].error is not None:
        raise SystemExit(f"no topic {topic} on the brokers")
    return sorted(md.topics[topic].partitions)


def line(schema, r):
    if schema.name == "HealthChanged":
        scope = f" ({r['scope']} only)" if r.get("scope") else ""
        return (f"{r['pool']}/{r['endpoint']}{scope} seq {r['seq']}: {r['from_state'].lower()} -> {r['to_state'].lower()} "
                f"weight {r['weight']:.2f} [{r['reason_code']}] {r['reason']}")
    if schema.name == "PoolHealthChanged":
        return (f"{r['pool']} pool: {r['healthy']} of {r['endpoints']} healthy, panic={r['panic']} "
                f"correlated_outage={r['correlated_outage']}")
    return f"{r['pool']}/{r['endpoint']} is {r['state'].lower()} (weight {r['weight']:.2f}, seq {r['seq']})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    ap.add_argument("--state-topic", default="vitals.health-state.v1")
    ap.add_argument("--changes-topic", default="vitals.health-changes.v1")
    ap.add_argument("--max", type=int, default=0, help="stop after this many changes (0: never)")
    ap.add_argument("--from-beginning", action="store_true", help="replay the changes topic from its start")
    ap.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (0: never)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.timeout if args.timeout else None

    # 1. The current state: the compacted state topic, read to its end.
    c = consumer(args.brokers)
    ends = {}
    for p in partitions(c, args.state_topic):
        low, high = c.get_watermark_offsets(TopicPartition(args.state_topic, p), timeout=10)
        if high > low:
            ends[p] = high
    c.assign([TopicPartition(args.state_topic, p, OFFSET_BEGINNING) for p in ends])
    latest = {}
    while ends:
        m = c.poll(1.0)
        if m is None or m.error():
            continue
        schema, r = decode_any(SCHEMAS, m.value() or b"")
        if r is not None:
            latest[(r["pool"], r["endpoint"])] = (schema, r)
        if m.offset() + 1 >= ends.get(m.partition(), 0):
            ends.pop(m.partition(), None)
    for schema, r in latest.values():
        print(line(schema, r), flush=True)
    c.close()

    # 2. The changes, as they happen.
    start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
    c = consumer(args.brokers)
    c.assign([TopicPartition(args.changes_topic, p, start) for p in partitions(c, args.changes_topic)])
    seen = 0
    try:
        while not args.max or seen < args.max:
            if deadline and time.monotonic() > deadline:
                raise SystemExit(f"only {seen} of {args.max} changes within {args.timeout} s")
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            schema, r = decode_any(SCHEMAS, m.value() or b"")
            if r is None:
                continue  # a record kind this example does not know
            print(line(schema, r), flush=True)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        c.close()


if __name__ == "__main__":
    sys.exit(main())
