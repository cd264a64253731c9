#!/usr/bin/env python3
"""What vitals-litellm costs LiteLLM: the callback's time per call (the routing filter, which runs
before each attempt, and the report, which LiteLLM runs after it), whole calls through the Router
with and without the callback, and the memory the callback adds. Prints its figures.

  python integrations/litellm/bench.py [--calls 2000] [--brokers 127.0.0.1:9092]

Needs a broker for the memory figures of a connected producer and consumer (the local stack:
scripts/stack.sh up); the upstream is a loopback server of its own.
"""
import argparse
import asyncio
import os
import resource
import sys
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))

import litellm  # noqa: E402
from litellm import Router  # noqa: E402

from fake_upstream import Upstream, refused_url  # noqa: E402
from vitals_litellm import Settings, VitalsCallback  # noqa: E402


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


async def calls(router, n):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        resp = await router.acompletion(model="g", messages=[{"role": "user", "content": "x"}], stream=True,
                                        max_tokens=4)
        async for _ in resp:
            pass
        lat.append((time.perf_counter() - t) * 1000)
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--brokers", default="127.0.0.1:9092")
    args = ap.parse_args()

    # 1. The callback's own work, per call, in microseconds.
    cb = VitalsCallback(Settings.from_env({}, kafka_brokers=args.brokers, queue_size=1_000_000))
    before = rss_mb()
    cb.start()
    cb.view.loaded.wait(30)
    time.sleep(1.0)
    started = rss_mb()
    deployments = [{"model_info": {"id": f"d{i}"}, "litellm_params": {}} for i in range(3)]
    f = timed(lambda: cb.filter("g", deployments), 50_000)
    kwargs = {"standard_logging_object": {"model_group": "g", "model_id": "d1", "model": "openai/sim", "stream": True},
              "litellm_params": {"metadata": {"model_group": "g"}, "model_info": {"id": "d1"}}, "stream": True}
    from datetime import datetime, timedelta

    t0 = datetime.now()

    def report():
        k = dict(kwargs)
        k["completion_start_time"] = t0 + timedelta(milliseconds=80)
        cb._report(k, None, t0, t0 + timedelta(milliseconds=120))

    r = timed(report, 10_000)
    queued = rss_mb()
    print(f"filter (before each attempt): p50 {pct(f, .5):.1f} us, p99 {pct(f, .99):.1f} us")
    print(f"report (after each attempt):  p50 {pct(r, .5):.1f} us, p99 {pct(r, .99):.1f} us")
    print(f"memory: {started - before:+.1f} MB started (producer, consumer, view), "
          f"{queued - started:+.1f} MB more with 10,000 reports passed through")
    cb.close(5)

    # 2. Whole calls through the Router to a loopback upstream, without and with the callback.
    up = Upstream("ok", ttft_s=0.0)
    r = Router(model_list=[{"model_name": "g", "litellm_params": {"model": "openai/sim", "api_base": up.url,
                                                                  "api_key": "none"}, "model_info": {"id": "d1"}}],
               num_retries=0, disable_cooldowns=True)
    results = {}
    down = refused_url()[7:-3]  # a broker address where nothing listens
    for label in ("without vitals", "with vitals", "with vitals, Kafka down") * 2:
        litellm.logging_callback_manager._reset_all_callbacks()
        c2 = None
        if label != "without vitals":
            brokers = down if "down" in label else args.brokers
            c2 = VitalsCallback(Settings.from_env({}, kafka_brokers=brokers, queue_size=1000))
            litellm.callbacks = [c2]
            c2.start()
            c2.view.loaded.wait(0 if "down" in label else 30)
        asyncio.run(calls(r, 50))  # warm
        lat = asyncio.run(calls(r, args.calls // 2))
        results.setdefault(label, []).extend(lat)
        if c2 is not None:
            final = c2.close(2)
            if "down" in label:
                print(f"Kafka down: {final['delivered']} delivered, {final['dropped_queue_full']} dropped "
                      f"(queue full), {final['dropped_undelivered']} undelivered of {final['queued'] + final['dropped_queue_full']}")
    for label, lat in results.items():
        print(f"calls {label}: p50 {pct(lat, .5):.2f} ms, p99 {pct(lat, .99):.2f} ms ({len(lat)} calls)")
    up.close()


if __name__ == "__main__":
    main()
