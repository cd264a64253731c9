#!/usr/bin/env python3
"""Load through LiteLLM's Router with vitals' callback, for the system tests (tests/system/tests/
litellm.rs) and for trying the plug-in by hand.

Every attempt LiteLLM makes is printed as one JSON line as it ends — {"attempt": deployment,
"t": start (unix s), "ok": bool, "outcome": vitals' class} — and the callback's counters once a
second ({"stats": {...}}). It runs until its standard input closes (or --duration passes), then
flushes the reports and prints the final counters ({"final": {...}}).

  drive_router.py --group chat --deployment chat-a=http://127.0.0.1:9311 --deployment ... --rate 20
"""
import argparse
import asyncio
import json
import os
import sys
import threading
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map

import litellm  # noqa: E402
from litellm import Router  # noqa: E402
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402

from vitals_litellm import Settings, VitalsCallback, classify  # noqa: E402


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Attempts(CustomLogger):
    """Records which deployment LiteLLM chose for every attempt (the test's ground truth)."""

    def _line(self, kwargs, exc, start_time):
        slo = kwargs.get("standard_logging_object") or {}
        o = classify(exc)
        emit({"attempt": slo.get("model_id") or "", "t": start_time.timestamp() if start_time else time.time(),
              "ok": exc is None, "outcome": o.outcome if o else "not_upstream"})

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._line(kwargs, None, start_time)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        self._line(kwargs, kwargs.get("exception"), start_time)


async def one(router, group, stream, timeout):
    try:
        resp = await router.acompletion(model=group, messages=[{"role": "user", "content": "are you there?"}],
                                        stream=stream, max_tokens=4, timeout=timeout)
        if stream:
            async for _ in resp:
                pass
    except Exception:  # noqa: BLE001 - the attempt lines say what happened
        pass


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", required=True, help="the model group (vitals' pool)")
    ap.add_argument("--deployment", action="append", required=True, help="NAME=URL of an OpenAI-compatible upstream")
    ap.add_argument("--rate", type=float, default=20.0, help="calls a second")
    ap.add_argument("--duration", type=float, default=600.0, help="stop after this many seconds at the latest")
    ap.add_argument("--timeout", type=float, default=10.0, help="per call, seconds")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--num-retries", type=int, default=0)
    args = ap.parse_args()

    callback = VitalsCallback(Settings.from_env())
    litellm.callbacks = [callback, Attempts()]
    model_list = []
    for d in args.deployment:
        name, url = d.split("=", 1)
        model_list.append({"model_name": args.group,
                           "litellm_params": {"model": "openai/sim", "api_base": url.rstrip("/") + "/v1",
                                              "api_key": "none"},
                           "model_info": {"id": name}})
    # LiteLLM's own cooldowns off: what the router leaves out, vitals left out.
    router = Router(model_list=model_list, num_retries=args.num_retries, disable_cooldowns=True)
    callback.start()

    closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), closed.set()), daemon=True).start()
    deadline = time.monotonic() + args.duration
    tasks = set()
    next_stats = time.monotonic()
    period = 1.0 / args.rate
    next_call = time.monotonic()
    while not closed.is_set() and time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_call:
            t = asyncio.create_task(one(router, args.group, not args.no_stream, args.timeout))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            next_call += period
            if next_call < now - 1.0:
                next_call = now  # an open loop, but no burst after a stall
        if now >= next_stats:
            emit({"stats": callback.stats()})
            next_stats = now + 1.0
        await asyncio.sleep(min(period, 0.05))
    if tasks:
        await asyncio.wait(tasks, timeout=args.timeout + 1)
    emit({"final": callback.close()})


if __name__ == "__main__":
    asyncio.run(main())
