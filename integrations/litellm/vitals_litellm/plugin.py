"""The LiteLLM callback: it reports every call attempt to vitals and narrows LiteLLM's choice of
deployment to what vitals keeps in rotation. One object does both, through extension points
LiteLLM supports for `CustomLogger`s registered in `litellm.callbacks` (or the proxy's
`litellm_settings.callbacks`):

* `async_post_call_failure_deployment_hook`, called once for every failed deployment attempt,
  retries and fallbacks included, as the attempt fails;
* the success and failure events (`log_*_event`, `async_log_*_event`): a success, and failures
  the deployment hook did not see (a stream that breaks after its answer began). These are
  request-level: the proxy shares one logging object between a call's retries, logs one failure
  per request, and hands a retry's success the failed attempt's `exception` — so a failure is
  taken from the deployment hook, and a success never reads `exception`;
* `async_filter_deployments`, which the Router runs on the deployments left after its own
  cooldowns, before its routing strategy picks one: vitals' weights, and the trial call that
  brings an endpoint back when its isolation is over.

The first content token of a streamed answer is timed where it passes: LiteLLM's stream wrapper
(`CustomStreamWrapper`, library mode and the proxy alike) is instrumented once, at start, so
that the time reported is the first content or tool call, not LiteLLM's first chunk (which many
upstreams send empty, at once).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields

from litellm.integrations.custom_logger import CustomLogger

from . import outcome as oc
from .reporter import Report, Reporter, escape_name
from .view import OPEN, Follower, HealthView

log = logging.getLogger("vitals_litellm")

ROUTING_MODES = ("weighted", "exclude", "off")


@dataclass
class Settings:
    """How the callback reaches vitals. Every field has an environment variable (`VITALS_` and the
    field's name in capitals, e.g. `VITALS_KAFKA_BROKERS`)."""

    kafka_brokers: str = "127.0.0.1:9092"
    # "kafka" (Avro single-object records on the signals topic) or "http" (the API's ingest).
    transport: str = "kafka"
    ingest_url: str = ""
    token: str = ""
    gateway: str = field(default_factory=lambda: f"litellm-{socket.gethostname()}")
    # Where this proxy runs (a region or zone): reported with each call (attribute `location`),
    # and the view follows the decisions vitals makes for it (docs/decisions.md, "Scoped health").
    location: str = ""
    signals_topic: str = "vitals.signals.v1"
    # "pool" (the signals topic's key) or "endpoint": for a fleet of replicas reporting through
    # a merge stage (`VITALS_SIGNALS_TOPIC=vitals.gateway-signals.v1`, docs/fleet.md).
    key: str = "pool"
    state_topic: str = "vitals.health-state.v1"
    changes_topic: str = "vitals.health-changes.v1"
    queue_size: int = 10_000
    delivery_timeout_s: float = 30.0
    # "weighted": one deployment chosen by vitals' weights; "exclude": every deployment in
    # rotation, LiteLLM's strategy picks; "off": report only.
    routing: str = "weighted"
    stale_after_s: float = 15.0
    open_after_s: float = 60.0
    # "skip": a deployment's successes during this process's warm-up with it are reported
    # untimed (counted, their times — LiteLLM's cold start — kept out of vitals' latency);
    # "report": every attempt is reported with its times.
    warmup: str = "skip"

    def scopes(self) -> set:
        """The scopes whose decisions this proxy follows besides the fleet's: its gateway (as it
        reports it) and its location."""
        out = {f"gateway={escape_name(self.gateway) or 'litellm'}"}
        if self.location:
            out.add(f"location={self.location}")
        return out

    @classmethod
    def from_env(cls, env=None, **overrides) -> Settings:
        env = os.environ if env is None else env
        s = cls()
        for f in fields(cls):
            raw = env.get(f"VITALS_{f.name.upper()}")
            if raw is not None and raw != "":
                kind = type(getattr(s, f.name))
                try:
                    setattr(s, f.name, kind(raw))
                except ValueError as e:
                    raise ValueError(f"VITALS_{f.name.upper()}={raw!r}: {e}") from None
        for k, v in overrides.items():
            if not hasattr(s, k):
                raise TypeError(f"unknown setting {k!r}")
            setattr(s, k, v)
        if s.warmup not in ("skip", "report"):
            raise ValueError(f"VITALS_WARMUP must be skip or report, not {s.warmup!r}")
        if s.key not in ("pool", "endpoint"):
            raise ValueError(f"VITALS_KEY must be pool or endpoint, not {s.key!r}")
        if s.routing not in ROUTING_MODES:
            raise ValueError(f"VITALS_ROUTING must be one of {', '.join(ROUTING_MODES)}, not {s.routing!r}")
        return s


class _Counts:
    def __init__(self):
        self._lock = threading.Lock()
        self.values: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] = self.values.get(name, 0) + n


def _has_content(chunk) -> bool:
    try:
        choices = getattr(chunk, "choices", None)
        delta = getattr(choices[0], "delta", None) if choices else None
        return delta is not None and bool(getattr(delta, "content", None) or getattr(delta, "tool_calls", None))
    except (AttributeError, IndexError, TypeError):
        return False


class _Bounded:
    """A bounded map (the oldest entries go first), safe across threads."""

    def __init__(self, cap: int = 10_000):
        self._lock = threading.Lock()
        self._at: OrderedDict = OrderedDict()
        self._cap = cap

    def _put(self, key, value) -> None:
        self._at[key] = value
        self._at.move_to_end(key)
        while len(self._at) > self._cap:
            self._at.popitem(last=False)

    def first(self, key, value=None) -> bool:
        """True the first time `key` is seen (it is remembered, with `value`); a later one keeps
        the first value."""
        with self._lock:
            if key in self._at:
                return False
            self._put(key, value)
            return True

    def pop(self, key):
        """The value of `key`, forgotten; None if there is none."""
        if key is None:
            return None
        with self._lock:
            return self._at.pop(key, None)

    def add(self, key) -> None:
        """Count one more of `key`."""
        with self._lock:
            self._put(key, self._at.get(key, 0) + 1)

    def take(self, key) -> bool:
        """Take one of `key` if there is one."""
        with self._lock:
            n = self._at.get(key, 0)
            if not n:
                return False
            if n == 1:
                del self._at[key]
            else:
                self._at[key] = n - 1
            return True


# When each streamed call's first content token passed, by LiteLLM call id, read once by the
# call's report. One map for every callback object: LiteLLM's stream class is instrumented once
# per process.
FIRST_TOKENS = _Bounded()
_instrumented = False
_instrument_lock = threading.Lock()


def instrument_streams() -> bool:
    """Time the first content token of every streamed answer where LiteLLM's stream wrapper hands
    it on (library mode and the proxy). Idempotent; False (and streams report no first token) if
    this LiteLLM has no `CustomStreamWrapper` to wrap."""
    global _instrumented
    with _instrument_lock:
        if _instrumented:
            return True
        try:
            from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper
        except ImportError as e:
            log.warning("vitals: cannot time first tokens (no LiteLLM stream wrapper): %s", e)
            return False
        anext_, next_ = CustomStreamWrapper.__anext__, CustomStreamWrapper.__next__

        def note(stream, chunk) -> None:
            try:
                if stream.__dict__.get("_vitals_first") or not _has_content(chunk):
                    return
                stream.__dict__["_vitals_first"] = True
                call_id = getattr(getattr(stream, "logging_obj", None), "litellm_call_id", None)
                if call_id:
                    FIRST_TOKENS.first(call_id, time.time())
            except Exception:  # noqa: BLE001 - timing never breaks a stream
                pass

        async def __anext__(self):
            chunk = await anext_(self)
            note(self, chunk)
            return chunk

        def __next__(self):
            chunk = next_(self)
            note(self, chunk)
            return chunk

        CustomStreamWrapper.__anext__ = __anext__
        CustomStreamWrapper.__next__ = __next__
        _instrumented = True
        return True


def _micros(t) -> int | None:
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return int(t * 1_000_000)
    try:
        return int(t.timestamp() * 1_000_000)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return None


def _where(kwargs) -> tuple[object, object, str | None]:
    """The model group, the deployment and the model of an attempt's kwargs (an event's, or the
    deployment hook's request data)."""
    slo = kwargs.get("standard_logging_object") or {}
    lp = kwargs.get("litellm_params") or {}
    meta = lp.get("metadata") or kwargs.get("metadata") or {}
    info = kwargs.get("model_info") or lp.get("model_info") or meta.get("model_info") or {}
    group = meta.get("model_group") or slo.get("model_group")
    deployment = endpoint_name(info) or slo.get("model_id")
    model = str(slo.get("model") or kwargs.get("model") or "")[:256] or None
    return group, deployment, model


def endpoint_name(deployment_or_model_info: dict | None) -> str | None:
    """The vitals endpoint of a deployment: its `model_info.vitals_endpoint` if set, else its
    `model_info.id` (set `id` in the config for readable names; LiteLLM makes one up otherwise)."""
    d = deployment_or_model_info or {}
    info = d.get("model_info", d) if isinstance(d, dict) else {}
    if not isinstance(info, dict):
        return None
    return info.get("vitals_endpoint") or info.get("id")


class VitalsCallback(CustomLogger):
    """Report to vitals and route by it. Nothing starts until the first call (or `start()`), so
    importing the module and building the object are free; a process that forks starts its own."""

    def __init__(self, settings: Settings | None = None, **overrides):
        super().__init__()
        self.settings = settings or Settings.from_env(**overrides)
        self.counts = _Counts()
        self.view = HealthView(self.settings.stale_after_s, self.settings.open_after_s, self.settings.scopes())
        self.reporter: Reporter | None = None
        self.follower: Follower | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._failed = False
        self._seen = _Bounded()  # attempts reported from a request-level event
        self._hooked = _Bounded()  # failures reported from the deployment hook, not yet matched
        self._last_refusal_log = 0.0
        # Per deployment, when this process's first success with it ended (µs): successes begun
        # before are its warm-up (see _warming_up).
        self._warm: dict = {}

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> VitalsCallback:
        """Start the reporter and the health follower in this process (idempotent)."""
        if self._pid == os.getpid() or self._failed:
            return self
        with self._lock:
            if self._pid == os.getpid() or self._failed:
                return self
            s = self.settings
            try:
                self.view = HealthView(s.stale_after_s, s.open_after_s, s.scopes())
                self.reporter = Reporter(
                    gateway=s.gateway, location=s.location, transport=s.transport, brokers=s.kafka_brokers, topic=s.signals_topic,
                    ingest_url=s.ingest_url, token=s.token or None, queue_size=s.queue_size,
                    delivery_timeout_s=s.delivery_timeout_s, key=s.key,
                )
                if s.routing != "off":
                    self.follower = Follower(self.view, s.kafka_brokers, s.state_topic, s.changes_topic).start()
            except Exception as e:  # noqa: BLE001 - a broken setting disables vitals, never LiteLLM
                self._failed = True
                log.error("vitals: disabled, could not start: %s", e)
                return self
            instrument_streams()
            self._pid = os.getpid()
            atexit.register(self.close)
            log.info("vitals: reporting to %s, routing %s", s.transport, s.routing)
        return self

    async def aclose(self, timeout_s: float = 10.0) -> dict:
        """`close()` after LiteLLM's logging tasks have run: the reports of calls that ended just
        before are queued (in async code, prefer this to `close()`)."""
        try:
            from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER

            await asyncio.wait_for(GLOBAL_LOGGING_WORKER.flush(), timeout_s)
        except (ImportError, asyncio.TimeoutError, AttributeError) as e:
            log.warning("vitals: LiteLLM's logging tasks not all done before close: %r", e)
        # The events LiteLLM runs as tasks of their own, not through its worker.
        await asyncio.sleep(0)
        return self.close(timeout_s)

    def close(self, timeout_s: float = 10.0) -> dict:
        """Flush the reports (waiting up to `timeout_s`) and stop following."""
        if self.follower is not None:
            self.follower.stop()
        if self.reporter is not None and self._pid == os.getpid():
            self.reporter.close(timeout_s)
        return self.stats()

    def stats(self) -> dict:
        """Counters: reports queued, delivered and dropped (by reason), routing decisions."""
        out = dict(self.reporter.counters.snapshot()) if self.reporter else {}
        out.update(self.counts.values)
        out["view_endpoints"] = len(self.view)
        lags = sorted(self.view.change_lags_ms)
        if lags:
            out["change_lag_ms_p50"] = round(lags[len(lags) // 2], 1)
            out["change_lag_ms_max"] = round(lags[-1], 1)
        out["view_freshness"] = self.view.freshness() if self.view.loaded.is_set() else "loading"
        return out

    # -- reporting ----------------------------------------------------------------------------

    def _attempt(self, kwargs, failed: bool, exc: BaseException | None, start_time, end_time,
                 from_event: bool) -> None:
        """Report one attempt. Never raises: whatever goes wrong here is counted and logged, the
        call goes on."""
        try:
            call_id = kwargs.get("litellm_call_id")
            if from_event:
                key = (call_id or id(kwargs), _micros(start_time), _micros(end_time), failed)
                if not self._seen.first(key):
                    return  # the sync and the async event of one attempt
                if failed and call_id and self._hooked.take(call_id):
                    return  # the deployment hook reported this attempt as it failed
            self.start()
            if self.reporter is None:
                return
            group, deployment, model = _where(kwargs)
            if not group or not deployment:
                self.counts.add("not_routed")  # not a Router call: no deployment to report on
                return
            if failed and exc is None:
                exc = RuntimeError("LiteLLM reported a failure without an exception")
            outcome = oc.classify(exc if failed else None)
            if outcome is None:
                self.counts.add("not_upstream_failures")
                return
            pool, endpoint = escape_name(group), escape_name(deployment)
            if pool is None or endpoint is None:
                self.reporter.counters.add("refused_names")
                self._log_refusal(group, deployment)
                return
            started = _micros(start_time) or time.time_ns() // 1000
            ended = _micros(end_time) or started
            untimed = (not failed and self.settings.warmup == "skip"
                       and self._warming_up(pool, endpoint, started, ended))
            if untimed:
                self.counts.add("warmup_untimed")
            ttft = None
            first = _micros(FIRST_TOKENS.pop(call_id)) if kwargs.get("stream") else None
            if first is not None and first > started and (not failed or first < ended) and not untimed:
                ttft = first - started
            self.reporter.report(Report(
                pool=pool, endpoint=endpoint, occurred_at=started, outcome=outcome.outcome,
                http_status=outcome.http_status, latency_us=max(0, ended - started), ttft_us=ttft,
                model=model, retry_after_ms=outcome.retry_after_ms, untimed=untimed,
            ))
        except Exception as e:  # noqa: BLE001
            self.counts.add("report_errors")
            log.warning("vitals: a call could not be reported: %s", e)

    def _warming_up(self, pool: str, endpoint: str, started: int, ended: int) -> bool:
        """Whether a success is part of this process's warm-up with the deployment: its first
        success, or one begun before that ended. Their times are LiteLLM's own cold start (its
        HTTP client made, its connection opened: 1.2 to 1.7 s of first token where the next calls
        take 50 ms), not the upstream's, and reported they made a healthy deployment look slow
        next to its peers. Failures are always reported."""
        key = (pool, endpoint)
        with self._lock:
            first_end = self._warm.get(key)
            if first_end is None:
                self._warm[key] = ended
                return True
        return started < first_end

    def _log_refusal(self, group, deployment) -> None:
        """One warning per 10 s at most, with the count so far (a refused name is refused on every
        call)."""
        now = time.monotonic()
        if now - self._last_refusal_log >= 10.0:
            self._last_refusal_log = now
            log.warning("vitals: a name vitals cannot take, not reported (%d so far): pool=%r endpoint=%r",
                        self.reporter.counters.snapshot()["refused_names"], str(group)[:80], str(deployment)[:80])

    def _event(self, kwargs, failed: bool, start_time, end_time) -> None:
        slo = kwargs.get("standard_logging_object") or {}
        start_time = start_time or slo.get("startTime")
        end_time = end_time or slo.get("endTime")
        exc = kwargs.get("exception") if failed else None
        self._attempt(kwargs, failed, exc, start_time, end_time, from_event=True)

    def log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._event(kwargs, False, start_time, end_time)

    def log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._event(kwargs, True, start_time, end_time)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._event(kwargs, False, start_time, end_time)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._event(kwargs, True, start_time, end_time)

    async def async_post_call_failure_deployment_hook(self, request_data, exception, call_type,
                                                      fallback_depth=None):
        """Every failed deployment attempt, as it fails (LiteLLM's request-level failure event
        comes once per request in the proxy, and late)."""
        try:
            call_id = request_data.get("litellm_call_id")
            details = getattr(request_data.get("litellm_logging_obj"), "model_call_details", None) or {}
            started = details.get("current_attempt_api_call_start_time") or details.get("api_call_start_time")
            if call_id:
                self._hooked.add(call_id)
            self._attempt(request_data, True, exception, started or time.time(), time.time(), from_event=False)
        except Exception as e:  # noqa: BLE001
            self.counts.add("report_errors")
            log.warning("vitals: a failed attempt could not be reported: %s", e)

    # -- routing ------------------------------------------------------------------------------

    def filter(self, model_group: str, deployments: list) -> list:
        """The deployments LiteLLM may choose from: in `weighted` mode one, chosen by vitals'
        weights (slow start included); in `exclude` mode those vitals keeps in rotation; all of
        them when the view has failed open, the pool is in panic mode or the view is not loaded
        yet; none when vitals has taken every one out of rotation (LiteLLM then falls back)."""
        mode = self.settings.routing
        if mode == "off" or not deployments:
            return deployments
        try:
            self.start()
            if not self.view.loaded.is_set():
                self.counts.add("route_not_loaded")
                return deployments
            pool = escape_name(model_group)
            names = [escape_name(endpoint_name(d)) or "" for d in deployments]
            trial = self.view.trial(pool or "", names)
            if trial is not None:
                # Out of rotation, its isolation over: this call is its trial (reported like
                # any other; the processor readmits it if it passed).
                self.counts.add("route_trials")
                return [deployments[trial]]
            weights = self.view.weights(pool or "", names)
            if weights is None:
                self.counts.add("route_open" if self.view.freshness() == OPEN else "route_panic")
                return deployments
            if mode == "exclude":
                kept = [d for d, w in zip(deployments, weights) if w > 0]
            else:
                i = self.view.choose(pool or "", names)
                kept = [] if i is None else [deployments[i]]
            if len(kept) < len(deployments):
                self.counts.add("route_narrowed")
            if not kept:
                self.counts.add("route_none_in_rotation")
            return kept
        except Exception as e:  # noqa: BLE001 - routing errors fail open
            self.counts.add("route_errors")
            log.warning("vitals: routing by health failed, all deployments kept: %s", e)
            return deployments

    async def async_filter_deployments(self, model, healthy_deployments, messages, request_kwargs=None,
                                       parent_otel_span=None):
        return self.filter(model, healthy_deployments)
