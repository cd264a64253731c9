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
    overrides.setdefault("warmup", "report")
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
    ups = {m: Upstream(m, ttft_s=0.3, role_late=True) for m in ("ok", "drop", "429", "429r", "500", "400", "hang")}
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
            ("g-429r", False, "RATE_LIMITED", 429, 1500, False),  # x-ratelimit-reset-requests
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
                                              queue_size=50, delivery_timeout_s=1.0, warmup="report"))
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


def test_a_view_applies_the_fleets_transitions_and_its_own_scopes_only():
    mine = HealthView(scopes={"gateway=litellm-a", "location=eu"})
    other = HealthView(scopes={"gateway=litellm-b", "location=us"})
    t0 = 1_000_000_000
    for v in (mine, other):
        v.heard(t0)
        v.apply_change(change("a", 1, "HEALTHY", 1.0, t0))
        v.apply_change(change("b", 1, "HEALTHY", 1.0, t0))
    out = dict(change("a", 2, "UNHEALTHY", 0.0, t0 + 1), scope="gateway=litellm-a", retry_at=t0 + 30_000_000)
    assert mine.apply_change(out) == "next"
    assert other.apply_change(out) == "next", "another scope's transition moves the seq: no gap"
    assert mine.weights("p", ["a", "b"], t0 + 2) == [0.0, 1.0]
    assert other.weights("p", ["a", "b"], t0 + 2) == [1.0, 1.0]
    assert mine.trial("p", ["a", "b"], t0 + 29_999_999) is None
    mine.heard(t0 + 30_000_000)
    assert mine.trial("p", ["a", "b"], t0 + 30_000_000) == 0, "the scope's trial"
    back = dict(change("a", 3, "HEALTHY", 1.0, t0 + 31_000_000), scope="gateway=litellm-a")
    mine.apply_change(back)
    assert mine.weights("p", ["a", "b"], t0 + 31_000_001) == [1.0, 1.0]
    mine.apply_change(dict(change("a", 4, "UNHEALTHY", 0.0, t0 + 40_000_000), scope="location=eu"))
    mine.apply_change(change("a", 5, "UNHEALTHY", 0.0, t0 + 41_000_000))
    mine.apply_change(change("a", 6, "RECOVERING", 0.1, t0 + 42_000_000, ramp_ms=30_000))
    assert mine.endpoint("p", "a").effective() == "RECOVERING", "a fleet ejection ended the scoped one"
    assert Settings.from_env({}, gateway="litellm-a", location="eu").scopes() == {"gateway=litellm-a", "location=eu"}


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


# -- round 2: trials, retried attempts, first content tokens, names, closing ---------------------


def out(ep, seq, at_us, retry_at_us, state="UNHEALTHY"):
    c = change(ep, seq, state, 0.0, at_us)
    c["retry_at"] = retry_at_us
    return c


def test_a_trial_is_let_through_once_when_the_isolation_is_over():
    from vitals_litellm.view import TRIAL_AGAIN_AFTER_US

    v = HealthView()
    t0 = 1_000_000_000
    v.heard(t0)
    v.apply_change(change("a", 1, "HEALTHY", 1.0, t0))
    v.apply_change(out("b", 1, t0, t0 + 30_000_000))
    v.apply_change(out("m", 1, t0, None, state="MAINTENANCE"))
    names = ["a", "b", "m"]
    v.heard(t0 + 29_000_000)
    assert v.trial("p", names, t0 + 29_999_999) is None, "not before its isolation is over"
    v.heard(t0 + 30_000_000)
    assert v.trial("p", names, t0 + 30_000_000) == 1, "due: one call goes to b"
    assert v.trial("p", names, t0 + 30_000_001) is None, "one trial, not every call"
    assert v.trial("p", names, t0 + 30_000_000 + TRIAL_AGAIN_AFTER_US - 1) is None
    v.heard(t0 + 40_000_000)
    assert v.trial("p", names, t0 + 30_000_000 + TRIAL_AGAIN_AFTER_US) == 1, "no word on it: tried again"
    # The trial failed: the processor announces the next one; none before it.
    v.apply_change(out("b", 2, t0 + 41_000_000, t0 + 75_000_000))
    v.heard(t0 + 74_000_000)
    assert v.trial("p", names, t0 + 74_000_000) is None
    assert v.trial("p", names, t0 + 75_000_000) == 1
    # Readmitted: no more trials; an operator's maintenance never gets one.
    v.apply_change(change("b", 3, "RECOVERING", 0.1, t0 + 76_000_000))
    assert v.trial("p", names, t0 + 200_000_000) is None
    assert v.trials == 3


def test_no_trial_in_panic_or_failed_open_and_one_from_the_state_topic_after_30_s():
    v = HealthView(stale_after_s=15, open_after_s=60)
    t0 = 1_000_000_000
    v.apply_state({"pool": "p", "endpoint": "b", "seq": 4, "state": "UNHEALTHY", "weight": 0.0, "ramp_ms": 0,
                   "since": t0, "reason": ""})
    v.heard(t0 + 29_000_000)
    assert v.trial("p", ["b"], t0 + 29_000_000) is None
    v.heard(t0 + 30_000_000)
    assert v.trial("p", ["b"], t0 + 30_000_000) == 0, "the state topic has no trial time: 30 s after it went out"
    v.apply_pool({"pool": "p", "seq": 1, "panic": True, "correlated_outage": False})
    v.heard(t0 + 50_000_000)
    assert v.trial("p", ["b"], t0 + 50_000_000) is None, "panic: every endpoint is in use anyway"
    v.apply_pool({"pool": "p", "seq": 2, "panic": False, "correlated_outage": False})
    assert v.trial("p", ["b"], t0 + 66_000_000) is None, "stale: nobody would judge the trial"
    assert v.trial("p", ["b"], t0 + 200_000_000) is None, "failed open: every endpoint is in use anyway"
    v.heard(t0 + 200_000_000)
    assert v.trial("p", ["b"], t0 + 200_000_000) == 0


def test_the_filter_sends_the_due_trial_to_the_ejected_deployment_in_both_modes():
    for mode in ("weighted", "exclude"):
        cb = loaded_callback(mode)
        now = time.time_ns() // 1000
        cb.view.heard(now)
        cb.view.apply_change(change("a", 1, "HEALTHY", 1.0, now))
        cb.view.apply_change(change("b", 1, "HEALTHY", 1.0, now))
        cb.view.apply_change(out("c", 1, now - 31_000_000, now - 1_000_000))
        picks = [[d["model_info"]["id"] for d in cb.filter("p", DEPLOYMENTS)] for _ in range(50)]
        assert picks[0] == ["c"], (mode, picks[0])
        assert all("c" not in p for p in picks[1:]), mode
        assert cb.stats()["route_trials"] == 1


def test_names_keep_apart_once_escaped():
    assert escape_name("bad%0Aname") == "bad%250Aname"
    assert escape_name("bad\nname") == "bad%0Aname"
    assert escape_name("a\u200bb") == "a%u200Bb" and escape_name("a\u2028b") == "a%u2028b"
    assert escape_name("50% off") == "50%25 off"


def test_every_attempt_of_a_retried_call_is_reported_once_in_library_mode():
    bad, good = Upstream("503"), Upstream("ok")
    try:
        cb, rec = recording_callback()
        litellm.callbacks = [cb]
        r = Router(model_list=[{"model_name": "g", "litellm_params": {"model": "openai/sim", "api_base": u.url,
                                                                   "api_key": "none"},
                                "model_info": {"id": n}} for n, u in (("bad", bad), ("good", good))],
                   num_retries=1, disable_cooldowns=True, retry_after=0)

        async def run():
            for i in range(30):
                await call(r, "g", stream=i % 2 == 0)
            await settle(rec, bad.requests + good.requests)
            await asyncio.sleep(0.3)

        asyncio.run(run())
        by = {n: sorted(x.outcome for x in rec.reports if x.endpoint == n) for n in ("bad", "good")}
        assert set(by["bad"]) == {"SERVER_ERROR"} and set(by["good"]) == {"SUCCESS"}, by
        assert (len(by["bad"]), len(by["good"])) == (bad.requests, good.requests), by
        assert bad.requests > 0 and bad.requests + good.requests > 30, "some calls were retried"
    finally:
        bad.close()
        good.close()


def test_library_mode_times_the_first_content_token_not_the_empty_first_chunk():
    up = Upstream("ok", ttft_s=0.6)  # its empty role chunk at once, the first token 0.6 s later
    try:
        cb, rec = recording_callback()
        litellm.callbacks = [cb]
        r = router([("g", "slow-first", up.url)])

        async def run():
            for _ in range(3):
                assert await call(r, "g", stream=True)
            await settle(rec, 3)

        asyncio.run(run())
        assert len(rec.reports) == 3
        for rep in rec.reports:
            assert rep.ttft_us is not None and 600_000 <= rep.ttft_us < rep.latency_us, rep
    finally:
        up.close()


def test_aclose_reports_a_call_that_ended_just_before():
    up = Upstream("ok")
    try:
        cb = VitalsCallback(Settings.from_env({}, kafka_brokers=refused_url()[7:-3], routing="off",
                                              delivery_timeout_s=0.5, warmup="report"))
        litellm.callbacks = [cb]
        r = router([("g", "a", up.url)])

        async def run():
            assert await call(r, "g")
            return await cb.aclose(2.0)

        final = asyncio.run(run())
        assert final["queued"] == 1, final
        assert final["dropped_undelivered"] == 1 and final["sent"] == 1, final
    finally:
        up.close()


def test_reporter_counts_each_report_once_however_often_it_is_closed():
    rep = Reporter(gateway="t", brokers=refused_url()[7:-3], queue_size=100, delivery_timeout_s=0.3)
    from vitals_litellm import Report

    for _ in range(40):
        rep.report(Report("p", "e", time.time_ns() // 1000, "SUCCESS", 200, 1000, None, None, None))
    first = rep.close(0.05)
    time.sleep(0.5)  # the broker's refusals come in after close gave up on them
    rep._producer.poll(0.5)
    second = rep.close(1.0)
    assert first == second, (first, second)
    assert second["dropped_undelivered"] <= second["sent"] == second["queued"] == 40, second
    assert second["delivered"] + second["dropped_undelivered"] == 40, second
    assert not rep.report(Report("p", "e", 1, "SUCCESS", 200, 1, None, None, None))
    assert rep.counters.snapshot()["dropped_after_close"] == 1


def test_a_refused_name_is_logged_once_not_once_per_call(caplog):
    up = Upstream("ok")
    try:
        cb, rec = recording_callback()
        litellm.callbacks = [cb]
        r = router([("g", "x" * 300, up.url)])

        async def run():
            for _ in range(20):
                await call(r, "g")
            await asyncio.sleep(0.3)

        with caplog.at_level(logging.WARNING, logger="vitals_litellm"):
            asyncio.run(run())
        assert cb.stats()["refused_names"] == 20
        assert sum("cannot take" in m.getMessage() for m in caplog.records) == 1
    finally:
        up.close()


def test_a_deployments_warm_up_successes_are_not_reported_its_failures_are():
    up, bad = Upstream("ok", ttft_s=0.3), Upstream("500")
    try:
        cb, rec = recording_callback(warmup="skip")
        litellm.callbacks = [cb]
        r = router([("g", "a", up.url), ("h", "b", bad.url)])

        async def run():
            # Six at once: all begun before the first ended (LiteLLM's cold start), then four more.
            await asyncio.gather(*(call(r, "g", stream=True) for _ in range(6)))
            for _ in range(4):
                await call(r, "g", stream=True)
            for _ in range(3):
                await call(r, "h")
            await settle(rec, 7)
            await asyncio.sleep(0.3)

        asyncio.run(run())
        # Every attempt counted; the six of the cold start untimed (no latency, no first token).
        a = [x for x in rec.reports if x.endpoint == "a"]
        assert len(a) == 10, rec.reports
        assert sum(x.untimed for x in a) == 6 and all(x.ttft_us is None for x in a if x.untimed), a
        assert [x.outcome for x in rec.reports if x.endpoint == "b"] == ["SERVER_ERROR"] * 3
        assert cb.stats()["warmup_untimed"] == 6
    finally:
        up.close()
        bad.close()


def test_a_fleet_behind_a_merge_stage_keys_reports_by_endpoint():
    # The merge stage (docs/fleet.md) needs every replica's calls to one endpoint on one
    # partition: the endpoint key, `%` and `/` escaped as the contracts' keys.rs does.
    from vitals_litellm.reporter import Report

    s = Settings.from_env({"VITALS_KEY": "endpoint", "VITALS_SIGNALS_TOPIC": "vitals.gateway-signals.v1"})
    assert s.key == "endpoint"
    with pytest.raises(ValueError, match="VITALS_KEY"):
        Settings.from_env({"VITALS_KEY": "gateway"})
    keys = {}
    for key in ("pool", "endpoint"):
        r = Reporter("gw", brokers=refused_url()[7:-3], topic="t", key=key)
        sent = []

        class Capture:
            def produce(self, topic, key, value, on_delivery):
                sent.append((topic, key))

            def poll(self, _timeout):
                return 0

        r._producer = Capture()
        r._send_kafka([Report("openai/gpt-4o", "eu%1", 1, "SUCCESS", 200, 10, None, None, None)])
        keys[key] = sent
    assert keys == {"pool": [("t", b"openai/gpt-4o")], "endpoint": [("t", b"openai%2Fgpt-4o/eu%251")]}


def test_ratelimit_resets_read_as_the_rust_bridges_read_them():
    from vitals_litellm.outcome import limit_lifts_in_ms, ratelimit_reset_ms
    for v, ms in [("20ms", 20), ("1s", 1000), ("6m0s", 360_000), ("1h2m3.5s", 3_723_500), ("0.5s", 500),
                  (" 2 ", 2000), ("1.25", 1250)]:
        assert ratelimit_reset_ms(v) == ms, v
    for v in ["", "s", "1x", "m1s", "-1s", "1d", "25h", "90000", "1s2", "nan", "inf"]:
        assert ratelimit_reset_ms(v) is None, v
    both = {"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "6m0s"}
    assert limit_lifts_in_ms({"retry-after": "7", **both}) == 7000
    assert limit_lifts_in_ms(both) == 360_000
    assert limit_lifts_in_ms({"x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "9", **both}) == 2000
    assert limit_lifts_in_ms({"x-ratelimit-remaining-requests": "3", "x-ratelimit-remaining-tokens": "0", **both}) == 360_000
    assert limit_lifts_in_ms({}) is None
    # retry-after-ms first, as the Rust bridges read it; one that does not parse is passed over
    # (`inf` raised OverflowError here before).
    assert limit_lifts_in_ms({"retry-after-ms": "1500", "retry-after": "7", **both}) == 1500
    assert limit_lifts_in_ms({"retry-after-ms": "20.4", "retry-after": "7"}) == 20
    for bad in ["inf", "NaN", "-5", "", "1e309", "soon", "86400001"]:
        assert limit_lifts_in_ms({"retry-after-ms": bad, "retry-after": "7"}) == 7000, bad
    for bad in ["inf", "1e400", "-1", "nan"]:
        assert limit_lifts_in_ms({"retry-after": bad}) is None, bad
