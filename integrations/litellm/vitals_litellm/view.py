"""The health of every endpoint, as vitals' processor publishes it, with the semantics of the Rust
health view (crates/healthview): a cold start from the compacted state topic (read to its end),
then the changes topic from a minute before the cold start began; a per-endpoint `seq` drops
duplicates and detects gaps (a gap re-reads the state topic, at most once per 10 s); a recovering
endpoint's weight ramps locally from `ramp_ms`; panic mode spreads over every endpoint. A view
that hears nothing from the processor (no change, no tick) for `stale_after` is *stale* and keeps
routing as last known; after `open_after` it *fails open*. A view applies the fleet's transitions
and those of its own `scopes` (`gateway=litellm-a`, `location=eu`): an endpoint out for one of
them is out here only; a fleet transition out of rotation ends every scoped one."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

from .avro import decode_health

log = logging.getLogger("vitals_litellm")

FRESH, STALE, OPEN = "fresh", "stale", "open"
# States in which an endpoint serves no traffic (weight 0 unless the pool panics).
OUT_OF_ROTATION = ("UNHEALTHY", "MAINTENANCE")
# An endpoint out of rotation whose trial time the view does not know (it was read from the state
# topic, which carries none) is tried this long after it went out: the shortest isolation.
TRIAL_UNKNOWN_AFTER_US = 30_000_000
# A trial whose outcome brought no transition (its report lost, or a 4xx that says nothing) is
# tried again after this long.
TRIAL_AGAIN_AFTER_US = 10_000_000


@dataclass
class Endpoint:
    state: str = "HEALTHY"
    weight: float = 1.0
    ramp_ms: int = 0
    since_us: int = 0
    seq: int = -1
    reason: str = ""
    retry_at_us: int | None = None
    # When this view last let a trial call through to it (µs; 0: never).
    trial_sent_us: int = 0
    # The scoped decisions of this view's scopes in force: scope -> (trial time µs, since µs).
    scoped: dict | None = None

    def effective(self) -> str:
        """The state this view routes by: out while one of its scopes is."""
        return "UNHEALTHY" if self.scoped else self.state

    def trial_due(self, now_us: int) -> bool:
        """Whether the router's trial is due: out of rotation for a fault (not an operator's
        maintenance), its isolation over, and no trial let through since the last word on it."""
        if self.effective() != "UNHEALTHY":
            return False
        if self.scoped:
            retry_at, since = min(self.scoped.values(), key=lambda v: v[0] if v[0] is not None else 1 << 62)
        else:
            retry_at, since = self.retry_at_us, self.since_us
        due = retry_at if retry_at is not None else since + TRIAL_UNKNOWN_AFTER_US
        if now_us < due:
            return False
        return self.trial_sent_us < max(due, since) or now_us - self.trial_sent_us >= TRIAL_AGAIN_AFTER_US

    def weight_at(self, now_us: int) -> float:
        """The weight now: 0 while a scope of this view's is out; a recovering endpoint ramps
        from its weight to 1 over `ramp_ms`."""
        if self.scoped:
            return 0.0
        if self.ramp_ms <= 0 or self.weight >= 1.0:
            return self.weight
        done = min(1.0, max(0.0, (now_us - self.since_us) / (self.ramp_ms * 1000.0)))
        return self.weight + (1.0 - self.weight) * done


@dataclass
class Pool:
    seq: int = -1
    panic: bool = False
    correlated_outage: bool = False


def now_us() -> int:
    return time.time_ns() // 1000


class HealthView:
    """Endpoints by (pool, endpoint); thread-safe. Applying is the follower's, reading anyone's."""

    def __init__(self, stale_after_s: float = 15.0, open_after_s: float = 60.0, scopes=()):
        self._lock = threading.Lock()
        self.scopes = frozenset(scopes)
        self._endpoints: dict[tuple[str, str], Endpoint] = {}
        self._pools: dict[str, Pool] = {}
        self.stale_after_us = int(stale_after_s * 1e6)
        self.open_after_us = int(max(open_after_s, stale_after_s) * 1e6)
        self._heard_us = 0
        self.loaded = threading.Event()  # the cold start is done
        self.applied = self.duplicates = self.gaps = self.rereads = 0
        self.trials = 0  # trial calls let through to endpoints out of rotation
        # How long after the processor's decision each of the latest changes reached the view (ms).
        self.change_lags_ms: deque = deque(maxlen=256)

    # -- applying -----------------------------------------------------------------------------

    def heard(self, at_us: int) -> None:
        self._heard_us = max(self._heard_us, at_us)

    def apply_state(self, s: dict) -> None:
        with self._lock:
            ep = self._endpoints.setdefault((s["pool"], s["endpoint"]), Endpoint())
            if s["seq"] > ep.seq or ep.seq < 0:
                ep.state, ep.weight, ep.ramp_ms = s["state"], s["weight"], s.get("ramp_ms", 0)
                ep.since_us, ep.seq, ep.reason = _micros(s["since"]), s["seq"], s.get("reason", "")
                ep.retry_at_us = None  # the state topic does not carry it
                if s["state"] in OUT_OF_ROTATION:
                    ep.scoped = None

    def apply_change(self, h: dict) -> str:
        """'next', 'gap' or 'duplicate'."""
        with self._lock:
            ep = self._endpoints.setdefault((h["pool"], h["endpoint"]), Endpoint())
            if h["seq"] <= ep.seq:
                self.duplicates += 1
                return "duplicate"
            applied = "gap" if ep.seq >= 0 and h["seq"] > ep.seq + 1 else "next"
            ep.seq = h["seq"]
            retry_at = h.get("retry_at")
            retry_at_us = None if retry_at is None else _micros(retry_at)
            scope = h.get("scope")
            if scope is None:
                ep.state, ep.weight, ep.ramp_ms = h["to_state"], h["weight"], h.get("ramp_ms", 0)
                ep.since_us, ep.reason = _micros(h["stream_time"]), h.get("reason", "")
                ep.retry_at_us = retry_at_us
                if h["to_state"] in OUT_OF_ROTATION:
                    ep.scoped = None
            elif scope in self.scopes:
                scoped = dict(ep.scoped or {})
                scoped.pop(scope, None)
                if h["to_state"] == "UNHEALTHY":
                    scoped[scope] = (retry_at_us, _micros(h["stream_time"]))
                ep.scoped = scoped or None
            # another scope's transition only moves the seq
            if applied == "gap":
                self.gaps += 1
            else:
                self.applied += 1
            return applied

    def apply_pool(self, p: dict) -> bool:
        with self._lock:
            pool = self._pools.setdefault(p["pool"], Pool())
            if p["seq"] > pool.seq:
                pool.seq, pool.panic, pool.correlated_outage = p["seq"], p["panic"], p["correlated_outage"]
                return True
            return False

    # -- reading ------------------------------------------------------------------------------

    def freshness(self, at_us: int | None = None) -> str:
        heard = self._heard_us
        silent = (at_us if at_us is not None else now_us()) - heard
        if heard == 0 or silent <= self.stale_after_us:
            return FRESH
        return STALE if silent <= self.open_after_us else OPEN

    def endpoint(self, pool: str, endpoint: str) -> Endpoint | None:
        with self._lock:
            ep = self._endpoints.get((pool, endpoint))
            return None if ep is None else Endpoint(**ep.__dict__)

    def panic(self, pool: str) -> bool:
        with self._lock:
            p = self._pools.get(pool)
            return bool(p and p.panic)

    def weights(self, pool: str, endpoints: list[str], at_us: int | None = None) -> list[float] | None:
        """Each candidate's weight at `at_us` (one the view does not know weighs 1); None when
        every candidate is to be used alike: the view failed open or the pool is in panic mode."""
        t = at_us if at_us is not None else now_us()
        if self.freshness(t) == OPEN:
            return None
        with self._lock:
            p = self._pools.get(pool)
            if p is not None and p.panic:
                return None
            out = []
            for name in endpoints:
                ep = self._endpoints.get((pool, name))
                out.append(1.0 if ep is None else ep.weight_at(t))
            return out

    def trial(self, pool: str, endpoints: list[str], at_us: int | None = None) -> int | None:
        """The index of one of `endpoints` whose trial is due, claimed (this view lets no other
        call through to it until a transition, or `TRIAL_AGAIN_AFTER_US`); None if none is.
        The trial is the real call that tells the processor whether the endpoint healed, as the
        transition that took it out announced ("the router's trial is due in 30 s"): without it
        an endpoint out of rotation comes back only on a prober's evidence. None while the view
        is not fresh (a trial's outcome needs a processor that hears it; failed open, every
        endpoint is in use) or the pool panics (every endpoint is in use)."""
        t = at_us if at_us is not None else now_us()
        if self.freshness(t) != FRESH:
            return None  # a trial's outcome needs a processor that hears it
        with self._lock:
            p = self._pools.get(pool)
            if p is not None and p.panic:
                return None
            for i, name in enumerate(endpoints):
                ep = self._endpoints.get((pool, name))
                if ep is not None and ep.trial_due(t):
                    ep.trial_sent_us = t
                    self.trials += 1
                    return i
        return None

    def choose(self, pool: str, endpoints: list[str], at_us: int | None = None,
               rng: random.Random | None = None) -> int | None:
        """The index of one of `endpoints` by weight (uniformly in panic or failed open); None if
        every weight is 0."""
        if not endpoints:
            return None
        w = self.weights(pool, endpoints, at_us)
        r = (rng or random).random()
        if w is None:
            return min(int(r * len(endpoints)), len(endpoints) - 1)
        total = sum(w)
        if total <= 0:
            return None
        x = r * total
        for i, wi in enumerate(w):
            if x < wi:
                return i
            x -= wi
        return max(i for i, wi in enumerate(w) if wi > 0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._endpoints)


def _micros(t) -> int:
    """fastavro reads timestamp-micros as an aware datetime; µs since the epoch either way."""
    if isinstance(t, int):
        return t
    return int(t.timestamp() * 1_000_000)


class Follower:
    """Keeps a HealthView current from Kafka on a thread of its own (started by `start()`)."""

    def __init__(self, view: HealthView, brokers: str, state_topic: str = "vitals.health-state.v1",
                 changes_topic: str = "vitals.health-changes.v1", kafka_options: dict | None = None,
                 reread_after_gap_s: float = 10.0):
        self.view = view
        self.brokers = brokers
        self.state_topic = state_topic
        self.changes_topic = changes_topic
        self.kafka_options = dict(kafka_options or {})
        self.reread_after_gap_s = reread_after_gap_s
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vitals-litellm-view", daemon=True)

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _consumer(self):
        from confluent_kafka import Consumer

        conf = {
            "bootstrap.servers": self.brokers,
            "group.id": "vitals-litellm-view",  # nothing is committed: positions are explicit
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
        conf.update(self.kafka_options)
        return Consumer(conf, logger=logging.getLogger("vitals_litellm.kafka"))

    def _partitions(self, c, topic: str) -> list[int]:
        md = c.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise RuntimeError(f"no topic {topic} on {self.brokers}")
        return sorted(t.partitions)

    def load_state(self) -> None:
        """Every partition of the state topic from its beginning to its high watermark."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        c = self._consumer()
        try:
            ends = {}
            for p in self._partitions(c, self.state_topic):
                low, high = c.get_watermark_offsets(TopicPartition(self.state_topic, p), timeout=10)
                if high > low:
                    ends[p] = high
            c.assign([TopicPartition(self.state_topic, p, OFFSET_BEGINNING) for p in ends])
            while ends and not self._stop.is_set():
                m = c.poll(0.5)
                if m is None or m.error():
                    continue
                kind, rec = decode_health(m.value())
                if kind == "EndpointState":
                    self.view.apply_state(rec)
                if m.offset() + 1 >= ends.get(m.partition(), 0):
                    ends.pop(m.partition(), None)
        finally:
            c.close()

    def _run(self) -> None:
        from confluent_kafka import OFFSET_END, TopicPartition

        while not self._stop.is_set():
            try:
                since_ms = int(time.time() * 1000) - 60_000
                self.load_state()
                self.view.heard(now_us())
                self.view.loaded.set()
                c = self._consumer()
                parts = [TopicPartition(self.changes_topic, p, since_ms)
                         for p in self._partitions(c, self.changes_topic)]
                at = c.offsets_for_times(parts, timeout=10)
                c.assign([TopicPartition(self.changes_topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                          for tp in at])
                self.error = None
                self._follow(c)
                return
            except Exception as e:  # noqa: BLE001 - the broker is away: try again, fail open meanwhile
                self.error = str(e)
                log.warning("vitals: following health failed (retrying in 2 s): %s", e)
                self._stop.wait(2.0)

    def _follow(self, c) -> None:
        gap = False
        reread = time.monotonic()
        try:
            while not self._stop.is_set():
                m = c.poll(0.1)
                if m is not None and not m.error():
                    self.view.heard(now_us())
                    kind, rec = decode_health(m.value())
                    if kind == "HealthChanged":
                        applied = self.view.apply_change(rec)
                        gap |= applied == "gap"
                        if applied != "duplicate":
                            self.view.change_lags_ms.append((now_us() - _micros(rec["stream_time"])) / 1000)
                    elif kind == "PoolHealthChanged":
                        self.view.apply_pool(rec)
                if gap and time.monotonic() - reread >= self.reread_after_gap_s:
                    try:
                        self.load_state()
                        self.view.rereads += 1
                        gap = False
                    except Exception as e:  # noqa: BLE001
                        log.warning("vitals: re-reading the state topic failed: %s", e)
                    reread = time.monotonic()
        finally:
            c.close()
