"""Reports leave LiteLLM's request path through a bounded queue: the callback only appends a tuple
(never encodes, never does I/O, never blocks); a thread of its own encodes each report as a
CallOutcome and sends it to Kafka (keyed by pool, idempotent producer) or to the API's HTTP ingest.
A full queue, a full producer or a broker that does not confirm in time drops the report and
counts it; nothing is queued without bound and no exception reaches the caller."""

from __future__ import annotations

import functools
import json
import logging
import queue
import threading
import time
import unicodedata
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .avro import CALL_OUTCOME

log = logging.getLogger("vitals_litellm")

# vitals' name rules (crates/contracts/src/validate.rs): not blank, at most 256 bytes, no control,
# format or separator characters. Those are escaped as %XX (%uXXXX above U+00FF), and so is `%`
# itself, so that two names never meet in one (`a%0Ab` and `a\nb` stay apart); a blank or longer
# name is refused.
MAX_NAME_LEN = 256


def _escaped(c: str) -> bool:
    o = ord(c)
    return c == "%" or o < 0x20 or 0x7F <= o <= 0x9F or unicodedata.category(c) in ("Cf", "Zl", "Zp")


def endpoint_key(pool: str, endpoint: str) -> str:
    """The endpoint key (crates/contracts keys.rs): `pool/endpoint`, `%` and `/` escaped in each."""
    def esc(s: str) -> str:
        return s.replace("%", "%25").replace("/", "%2F")
    return f"{esc(pool)}/{esc(endpoint)}"


def escape_name(name: object) -> str | None:
    """`name` as vitals accepts it: `%`, control, format and line/paragraph separator characters
    written as `%XX` (`%uXXXX` beyond U+00FF), everything else kept; None if it is blank or longer
    than 256 bytes once escaped."""
    return _escape("" if name is None else str(name))


@functools.lru_cache(maxsize=4096)
def _escape(s: str) -> str | None:
    # Cached: the same few group and deployment names are escaped for every call and every
    # routing decision, a character class looked up per character.
    s = "".join((f"%{ord(c):02X}" if ord(c) <= 0xFF else f"%u{ord(c):04X}") if _escaped(c) else c for c in s)
    if not s.strip() or len(s.encode()) > MAX_NAME_LEN:
        return None
    return s


@dataclass
class Counters:
    """What the reporter did with the reports it was handed (read them with `snapshot()`)."""

    queued: int = 0
    sent: int = 0
    delivered: int = 0
    dropped_queue_full: int = 0
    dropped_producer_full: int = 0
    dropped_undelivered: int = 0
    refused_names: int = 0
    dropped_after_close: int = 0
    dropped_unsendable: int = 0  # refused by the producer itself (not for a full queue)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict:
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


@dataclass(frozen=True)
class Report:
    """One call attempt, as the callback saw it (times in µs since the epoch)."""

    pool: str
    endpoint: str
    occurred_at: int
    outcome: str
    http_status: int | None
    latency_us: int
    ttft_us: int | None
    model: str | None
    retry_after_ms: int | None
    attempt: str | None = None
    # Count the outcome, not its timing (the engine's `vitals.untimed`): a warm-up call.
    untimed: bool = False
    # Given once, when the attempt is reported, so that a batch sent again (its answer lost)
    # carries the same ids and the processor applies it once.
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()))


def to_record(r: Report, gateway: str, location: str = "") -> dict:
    """The CallOutcome record (current schema version) of a report."""
    attributes = {"source": "litellm"}
    if location:
        attributes["location"] = location
    if r.attempt:
        attributes["attempt"] = r.attempt
    if r.untimed:
        attributes["vitals.untimed"] = "true"
    return {
        "event_id": r.event_id,
        "pool": r.pool,
        "endpoint": r.endpoint,
        "gateway": gateway,
        "occurred_at": r.occurred_at,
        "outcome": r.outcome,
        "http_status": r.http_status,
        "latency_us": max(0, min(r.latency_us, 3_600_000_000)),
        "ttft_us": None if r.ttft_us is None else max(0, min(r.ttft_us, 3_600_000_000)),
        "tpot_us": None,
        "attributes": attributes,
        "model": r.model,
        "retry_after_ms": r.retry_after_ms,
    }


class Reporter:
    """The bounded queue and its sending thread. `transport` is `"kafka"` (with `brokers`) or
    `"http"` (with `ingest_url` and a writer `token`)."""

    def __init__(
        self,
        gateway: str,
        location: str = "",
        transport: str = "kafka",
        brokers: str | None = None,
        topic: str = "vitals.signals.v1",
        kafka_options: dict | None = None,
        ingest_url: str | None = None,
        token: str | None = None,
        queue_size: int = 10_000,
        delivery_timeout_s: float = 30.0,
        key: str = "pool",
    ):
        if transport not in ("kafka", "http"):
            raise ValueError(f"transport must be 'kafka' or 'http', not {transport!r}")
        if transport == "kafka" and not brokers:
            raise ValueError("the Kafka transport needs brokers (VITALS_KAFKA_BROKERS)")
        if transport == "http" and not ingest_url:
            raise ValueError("the HTTP transport needs the API's URL (VITALS_INGEST_URL)")
        if key not in ("pool", "endpoint"):
            raise ValueError(f"key must be 'pool' or 'endpoint' (a merge stage's input), not {key!r}")
        self.key_by_endpoint = key == "endpoint"
        self.gateway = escape_name(gateway) or "litellm"
        self.location = location
        self.transport = transport
        self.topic = topic
        self.counters = Counters()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_size))
        self._stop = threading.Event()
        self._delivery_timeout_s = delivery_timeout_s
        self._last_drop_log = 0.0
        # Set once close() has counted what was never confirmed: later confirmations are ignored,
        # so that every report is counted once.
        self._settled = False
        self._closed = False
        self._producer = None
        if transport == "kafka":
            from confluent_kafka import Producer

            conf = {
                "bootstrap.servers": brokers,
                "enable.idempotence": True,  # no duplicates when the producer retries
                "linger.ms": 20,
                "compression.type": "lz4",
                # Bounded: what the broker has not taken is dropped (counted), not kept forever.
                "queue.buffering.max.messages": max(1, queue_size),
                "message.timeout.ms": int(delivery_timeout_s * 1000),
                "client.id": f"vitals-litellm-{self.gateway}",
            }
            conf.update(kafka_options or {})
            self._producer = Producer(conf, logger=logging.getLogger("vitals_litellm.kafka"))
        self._ingest_url = (ingest_url or "").rstrip("/") + "/v1/signals"
        self._token = token
        self._thread = threading.Thread(target=self._run, name="vitals-litellm-reporter", daemon=True)
        self._thread.start()

    # -- the request path ---------------------------------------------------------------------

    def report(self, r: Report) -> bool:
        """Queue one report; False (and counted) if the queue is full or the reporter closed.
        Never blocks or raises."""
        if self._closed:
            self.counters.add("dropped_after_close")
            return False
        try:
            self._queue.put_nowait(r)
        except queue.Full:
            self.counters.add("dropped_queue_full")
            self._log_drops()
            return False
        self.counters.add("queued")
        return True

    # -- the sending thread -------------------------------------------------------------------

    def _log_drops(self) -> None:
        now = time.monotonic()
        if now - self._last_drop_log >= 10.0:  # at most one line per 10 s, with the totals
            self._last_drop_log = now
            log.warning("vitals: reports dropped so far: %s", self.counters.snapshot())

    def record(self, r: Report) -> dict:
        return to_record(r, self.gateway, self.location)

    def _delivered(self, err, _msg) -> None:
        if self._settled:
            return  # counted as lost when close() gave up on it
        if err is None:
            self.counters.add("delivered")
        else:
            self.counters.add("dropped_undelivered")
            self._log_drops()

    def _send_kafka(self, batch: list[Report]) -> None:
        for r in batch:
            try:
                self._producer.produce(
                    self.topic,
                    key=(endpoint_key(r.pool, r.endpoint) if self.key_by_endpoint else r.pool).encode(),
                    value=CALL_OUTCOME.encode(self.record(r)),
                    on_delivery=self._delivered,
                )
                self.counters.add("sent")
            except BufferError:
                self.counters.add("dropped_producer_full")
                self._log_drops()
            except Exception as e:  # noqa: BLE001 - one bad report never stops the reporter
                self.counters.add("dropped_unsendable")
                log.warning("vitals: a report could not be sent: %s", e)
        self._producer.poll(0)

    def _send_http(self, batch: list[Report]) -> None:
        items = []
        for r in batch:
            rec = self.record(r)
            items.append({
                "type": "call", "event_id": rec["event_id"], "pool": r.pool, "endpoint": r.endpoint,
                "gateway": self.gateway,
                "occurred_at": datetime.fromtimestamp(r.occurred_at / 1e6, timezone.utc).isoformat(),
                "outcome": r.outcome.lower(), "http_status": r.http_status, "latency_us": rec["latency_us"],
                "ttft_us": rec["ttft_us"], "model": r.model, "retry_after_ms": r.retry_after_ms,
                "attributes": rec["attributes"],
            })
        req = urllib.request.Request(self._ingest_url, data=json.dumps({"items": items}).encode(), method="POST")
        req.add_header("content-type", "application/json")
        if self._token:
            req.add_header("authorization", f"Bearer {self._token}")
        self.counters.add("sent", len(items))
        try:
            with urllib.request.urlopen(req, timeout=self._delivery_timeout_s) as resp:
                answer = json.loads(resp.read() or b"{}")
            accepted = sum(1 for i in answer.get("items", []) if i.get("status") == "accepted")
            self.counters.add("delivered", accepted)
            if accepted < len(items):
                self.counters.add("dropped_undelivered", len(items) - accepted)
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.counters.add("dropped_undelivered", len(items))
            log.warning("vitals: HTTP ingest failed, %d reports dropped: %s", len(items), e)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._producer is not None:
                    self._producer.poll(0)
                if self._stop.is_set():
                    return
                continue
            batch = [first]
            while len(batch) < 500:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if self._producer is not None:
                self._send_kafka(batch)
            else:
                self._send_http(batch)

    def close(self, timeout_s: float = 10.0) -> dict:
        """Send what is queued, wait up to `timeout_s` for the broker's confirmations, stop."""
        if self._closed:
            return self.counters.snapshot()
        self._closed = True
        self._stop.set()
        self._thread.join(timeout_s)
        if self._producer is not None:
            self._producer.flush(timeout_s)
            # What the broker neither confirmed nor refused by now is lost with the process.
            with self.counters._lock:
                self._settled = True
                c = self.counters
                missing = c.sent - c.delivered - c.dropped_undelivered
                if missing > 0:
                    c.dropped_undelivered += missing
        return self.counters.snapshot()
