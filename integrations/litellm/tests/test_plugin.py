"""The plug-in with the real LiteLLM Router (pinned in pyproject.toml) against small loopback
upstreams: what each failure is reported as, names vitals refuses, a broker that is down, and the
routing decisions from a health view. The loop with the real broker, processor and upstream
simulator is in tests/system/tests/litellm.rs."""
import asyncio
import logging
import os
import pathlib
import random
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import pytest  # noqa: E402
from litellm import Router  # noqa: E402

from fake_upstream import Upstream, refused_url  # noqa: E402
from vitals_litellm import HealthView, Reporter, Settings, VitalsCallback, escape_name  # noqa: E402
from vitals_litellm.avro import CALL_OUTCOME  # noqa: E402
from vitals_litellm.reporter import to_record  # noqa: E402
from vitals_litellm.view import OPEN, STALE  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
# Several tests point the plug-in at a broker where nothing listens on purpose: librdkafka's
# connection errors about it are expected, not news.
logging.getLogger("vitals_litellm.kafka").setLevel(logging.CRITICAL)


@pytest.fixture(autouse=True)
def fresh_callbacks():
    """LiteLLM keeps one callback per class across its lists once a call has run: each test starts
    from none (in a real process there is one vitals callback)."""
    litellm.logging_callback_manager._reset_all_callbacks()
    yield
    litellm.logging_callback_manager._reset_all_callbacks()


class Recorder:
    """Stands in for the reporter's queue, to read what the callback would send."""

    def __init__(self, counters):
        self.reports = []
        self.counters = counters

    def report(self, r):
        self.reports.append(r)
        return True

    def close(self, timeout_s=0):
        return self.counters.snapshot()


def recording_callback(**overrides):
    cb = VitalsCallback(Settings.from_env({}, routing="off", **overrides))
    cb.start()
    real = cb.reporter
    rec = Recorder(real.counters)
    cb.reporter = rec
    real.close(0.1)
    return cb, rec


def router(deployments, **kwargs):
    return Router(model_list=[{"model_name": group, "litellm_params": {"model": "openai/sim", "api_base": url,
                                                                      "api_key": "none"},
                               "model_info": {"id": name}} for group, name, url in deployments],
                  num_retries=0, disable_cooldowns=True, **kwargs)


async def call(r, group, stream=False, timeout=5.0):
    try:
        resp = await r.acompletion(model=group, messages=[{"role": "user", "content": "x"}], stream=stream,
                                   timeout=timeout, max_tokens=4)
        if stream:
            async for _ in resp:
                pass
        return True
    except Exception:  # noqa: BLE001
        return False


async def settle(rec, n, within=10.0):
    """Wait for the callbacks (LiteLLM runs them as tasks after the call) to have reported n."""
    end = time.monotonic() + within
    while len(rec.reports) < n and time.monotonic() < end:
        await asyncio.sleep(0.02)


def test_the_packaged_schemas_are_the_repositorys():
    packaged = REPO / "integrations" / "litellm" / "vitals_litellm" / "schemas"
    files = sorted(p.name for p in packaged.glob("*.avsc"))
    assert "call_outcome.avsc" in files and "health_changed.avsc" in files
    for name in files:
        assert (packaged / name).read_bytes() == (REPO / "schemas" / name).read_bytes(), name


def test_real_litellm_failures_are_reported_as_vitals_outcomes():
    ups = {m: Upstream(m, ttft_s=0.3, role_late=True) for m in ("ok", "drop", "429", "500", "400", "hang")}
    try:
        cb, rec = recording_callback()
        litellm.callbacks = [cb]
        deployments = [(f"g-{m}", f"d-{m}", u.url) for m, u in ups.items()] + [("g-refused", "d-refused", refused_url())]
        r = router(deployments)
        cases = [  # group, stream, expected outcome, status, retry-after, has first token
            ("g-ok", True, "SUCCESS", 200, None, True),
            ("g-ok", False, "SUCCESS", 200, None, False),
            ("g-drop", True, "CONNECTION_DROPPED", None, None, None),
            ("g-429", False, "RATE_LIMITED", 429, 7000, False),
            ("g-500", False, "SERVER_ERROR", 500, None, False),
            ("g-400", False, "CLIENT_ERROR", 400, None, False),
            ("g-hang", False, "TIMEOUT", None, None, False),
            ("g-refused", True, "CONNECT_ERROR", None, None, False),
        ]

        async def run():
            for i, (group, stream, *_rest) in enumerate(cases):
                await call(r, group, stream, timeout=1.0)
                await settle(rec, i + 1)

        asyncio.run(run())
        assert len(rec.reports) == len(cases), [x.outcome for x in rec.reports]
        for rep, (group, _stream, outcome, status, retry_after, first_token) in zip(rec.reports, cases):
            assert (rep.pool, rep.endpoint) == (group, "d-" + group[2:])
            assert (rep.outcome, rep.http_status, rep.retry_after_ms) == (outcome, status, retry_after), (group, rep)
            if first_token is not None:
                assert (rep.ttft_us is not None) == first_token, (group, rep)
            if first_token:
                # LiteLLM's first chunk (the Router's extension points see no later one), 0.3 s.
                assert 300_000 <= rep.ttft_us < rep.latency_us, rep
            assert rep.latency_us >= 0
            if group == "g-hang":
                assert rep.latency_us >= 900_000, rep  # it waited for its timeout
        # Every record encodes under the current CallOutcome schema.
        for rep in rec.reports:
            assert CALL_OUTCOME.decode(CALL_OUTCOME.encode(to_record(rep, "g")))["outcome"] == rep.outcome
    finally:
        for u in ups.values():
            u.close()


def test_names_vitals_refuses_are_escaped_or_refused_never_raised_into_the_call():
    up = Upstream("ok")
    try:
        cb, rec = recording_callback()
        litellm.callbacks = [cb]
        long_name = "x" * 300
        r = router([("g", "bad\nname\x7f", up.url), ("h", long_name, up.url), ("  ", "blank-pool", up.url)])

        async def run():
            results = [await call(r, "g"), await call(r, "h"), await call(r, "  ")]
            await settle(rec, 1)
            await asyncio.sleep(0.3)  # the two refused ones are counted, not queued
            return results

        assert asyncio.run(run()) == [True, True, True], "the calls themselves succeed"
        assert [(x.pool, x.endpoint) for x in rec.reports] == [("g", "bad%0Aname%7F")]
        assert cb.stats()["refused_names"] == 2
        assert escape_name("a/b c") == "a/b c" and escape_name("") is None and escape_name("é" * 129) is None
    finally:
        up.close()


def test_a_broker_that_is_down_drops_and_counts_reports_and_never_blocks():
    rep = Reporter(gateway="t", brokers=refused_url()[7:-3], queue_size=100, delivery_timeout_s=1.0)
    from vitals_litellm import Report

    r = Report("p", "e", time.time_ns() // 1000, "SUCCESS", 200, 1000, None, None, None)
    for _ in range(5000):
        rep.report(r)
    c = rep.counters.snapshot()
    assert c["queued"] + c["dropped_queue_full"] == 5000
    assert c["dropped_queue_full"] > 0, c
    final = rep.close(5.0)
    assert final["delivered"] == 0
    lost = final["dropped_queue_full"] + final["dropped_producer_full"] + final["dropped_undelivered"]
    assert lost == 5000, final


def test_calls_go_on_when_the_broker_is_down():
    up = Upstream("ok")
    try:
        cb = VitalsCallback(Settings.from_env({}, kafka_brokers=refused_url()[7:-3], routing="off",
                                              queue_size=50, delivery_timeout_s=1.0))
        litellm.callbacks = [cb]
        r = router([("g", "a", up.url)])

        async def run():
            return [await call(r, "g", stream=True) for _ in range(80)]

        assert all(asyncio.run(run()))
        final = cb.close(3.0)
        assert final["delivered"] == 0
        assert final["queued"] + final["dropped_queue_full"] == 80, final
    finally:
        up.close()


# -- routing from a health view ---------------------------------------------------------------


def change(ep, seq, state, weight, at_us, ramp_ms=0):
    return {"pool": "p", "endpoint": ep, "seq": seq, "to_state": state, "weight": weight, "ramp_ms": ramp_ms,
            "stream_time": at_us, "reason": "", "retry_at": None}


def test_a_silent_processor_makes_the_view_stale_then_open():
    v = HealthView(stale_after_s=15, open_after_s=60)
    v.apply_change(change("a", 1, "HEALTHY", 1.0, 0))
    v.apply_change(change("b", 1, "UNHEALTHY", 0.0, 0))
    s = 1_000_000
    v.heard(s)
    assert v.freshness(s + 15_000_000) == "fresh"
    assert v.freshness(s + 15_000_001) == STALE
    assert v.weights("p", ["a", "b"], s + 30_000_000) == [1.0, 0.0], "stale: as last known"
    assert v.freshness(s + 60_000_001) == OPEN
    assert v.weights("p", ["a", "b"], s + 61_000_000) is None, "open: every endpoint alike"


def test_duplicates_are_dropped_gaps_counted_and_recovery_ramps():
    v = HealthView()
    assert v.apply_change(change("a", 1, "UNHEALTHY", 0.0, 10)) == "next"
    assert v.apply_change(change("a", 1, "UNHEALTHY", 0.0, 10)) == "duplicate"
    assert v.apply_change(change("a", 3, "RECOVERING", 0.1, 1_000_000, ramp_ms=30_000)) == "gap"
    assert v.apply_change(change("a", 2, "HEALTHY", 1.0, 20)) == "duplicate"
    assert v.gaps == 1 and v.duplicates == 2
    w = v.endpoint("p", "a").weight_at
    assert abs(w(1_000_000) - 0.1) < 1e-9 and abs(w(16_000_000) - 0.55) < 1e-9 and w(40_000_000) == 1.0


def loaded_callback(routing):
    cb = VitalsCallback(Settings.from_env({}, routing=routing))
    cb._pid = os.getpid()  # no threads: the view is filled by hand
    cb.view.loaded.set()
    return cb


DEPLOYMENTS = [{"model_info": {"id": n}, "litellm_params": {}} for n in ("a", "b", "c")]


def test_the_filter_follows_vitals_weights_and_spreads_in_panic():
    cb = loaded_callback("weighted")
    now = time.time_ns() // 1000
    cb.view.heard(now)
    cb.view.apply_change(change("a", 1, "HEALTHY", 1.0, now))
    cb.view.apply_change(change("b", 1, "DEGRADED", 0.25, now))
    cb.view.apply_change(change("c", 1, "UNHEALTHY", 0.0, now))
    random.seed(7)
    picks = [cb.filter("p", DEPLOYMENTS) for _ in range(20_000)]
    assert all(len(p) == 1 for p in picks)
    share = {n: sum(p[0]["model_info"]["id"] == n for p in picks) / len(picks) for n in "abc"}
    assert abs(share["a"] - 0.8) < 0.02 and abs(share["b"] - 0.2) < 0.02 and share["c"] == 0.0, share
    ex = loaded_callback("exclude")
    ex.view = cb.view
    assert [d["model_info"]["id"] for d in ex.filter("p", DEPLOYMENTS)] == ["a", "b"]
    assert cb.filter("other-pool", DEPLOYMENTS[:1]) == DEPLOYMENTS[:1], "unknown endpoints weigh 1"
    cb.view.apply_pool({"pool": "p", "seq": 1, "panic": True, "correlated_outage": False})
    assert cb.filter("p", DEPLOYMENTS) == DEPLOYMENTS, "panic: every deployment, LiteLLM picks"


def test_every_deployment_out_of_rotation_leaves_none_and_an_unloaded_view_keeps_all():
    cb = loaded_callback("weighted")
    now = time.time_ns() // 1000
    cb.view.heard(now)
    for n in "abc":
        cb.view.apply_change(change(n, 1, "UNHEALTHY", 0.0, now))
    assert cb.filter("p", DEPLOYMENTS) == []
    assert cb.stats()["route_none_in_rotation"] == 1
    cold = VitalsCallback(Settings.from_env({}, routing="weighted"))
    cold._pid = os.getpid()
    assert cold.filter("p", DEPLOYMENTS) == DEPLOYMENTS
    assert cold.stats()["route_not_loaded"] == 1


def test_settings_come_from_the_environment_and_bad_ones_are_named():
    s = Settings.from_env({"VITALS_KAFKA_BROKERS": "127.0.0.1:1", "VITALS_QUEUE_SIZE": "5", "VITALS_ROUTING": "exclude"})
    assert (s.kafka_brokers, s.queue_size, s.routing) == ("127.0.0.1:1", 5, "exclude")
    with pytest.raises(ValueError, match="VITALS_QUEUE_SIZE"):
        Settings.from_env({"VITALS_QUEUE_SIZE": "many"})
    with pytest.raises(ValueError, match="VITALS_ROUTING"):
        Settings.from_env({"VITALS_ROUTING": "sometimes"})
