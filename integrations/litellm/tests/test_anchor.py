"""The scorecard puts vitals beside LiteLLM's own cooldown (crates/scorecard/src/anchors.rs,
docs/decisions.md "The anchors"). That model rests on what the pinned LiteLLM Router does by
default, checked here against the real Router and loopback upstreams: a refused connection
reaches it as an InternalServerError 500 and cools a deployment down once more than half of at
least five calls this minute failed; a 429 cools it down at once, for its Retry-After; a 400
never does. If a new LiteLLM changes any of these, the model (and its table) must follow."""
import asyncio
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from litellm import Router  # noqa: E402

from fake_upstream import Upstream, refused_url  # noqa: E402


def cooling_router(deployments):
    """LiteLLM's defaults, cooldowns on (the plug-in's own tests turn them off)."""
    litellm.callbacks = []
    return Router(model_list=[{"model_name": "g", "litellm_params": {"model": "openai/sim", "api_base": url,
                                                                   "api_key": "none"},
                               "model_info": {"id": name}} for name, url in deployments],
                  num_retries=0)


async def call(r):
    try:
        await r.acompletion(model="g", messages=[{"role": "user", "content": "x"}], timeout=2.0, max_tokens=4)
        return None
    except Exception as e:  # noqa: BLE001
        return e


async def cooling(r, ids, want=None, within=5.0):
    """The deployments in cooldown (waiting up to `within` for `want`: LiteLLM sets a cooldown in a
    task after the call returns)."""
    end = time.monotonic() + within
    while True:
        found = {c[0]: c[1] for c in await r.health().cooldowns.async_get_active_cooldowns(ids, None)}
        if want is None or want <= set(found) or time.monotonic() >= end:
            return found
        await asyncio.sleep(0.02)


def test_a_refused_connection_is_a_500_and_cools_down_when_most_of_five_calls_failed():
    async def run():
        r = cooling_router([("dead1", refused_url()), ("dead2", refused_url())])
        first = await call(r)
        assert type(first).__name__ == "InternalServerError" and first.status_code == 500, repr(first)
        assert "APIConnectionError" not in str(first), str(first)
        for _ in range(3):
            await call(r)
        # Four calls in all: neither deployment has had five.
        assert await cooling(r, ["dead1", "dead2"], within=0.3) == {}
        for _ in range(16):
            await call(r)
        found = await cooling(r, ["dead1", "dead2"], want={"dead1", "dead2"})
        assert set(found) == {"dead1", "dead2"}, found
        last = await call(r)
        assert type(last).__name__ == "RouterRateLimitError", repr(last)

    asyncio.run(run())


def test_a_429_cools_down_at_once_for_its_retry_after_and_a_400_never():
    limited, bad, ok = Upstream("429"), Upstream("400"), Upstream("ok")
    try:
        async def run():
            r = cooling_router([("lim", limited.url), ("ok", ok.url)])
            for _ in range(20):
                if await call(r) is not None:
                    break
            found = await cooling(r, ["lim", "ok"], want={"lim"})
            assert set(found) == {"lim"}, found
            assert float(found["lim"]["cooldown_time"]) == 7.0, found  # fake_upstream's Retry-After
            r = cooling_router([("bad", bad.url), ("ok2", ok.url)])
            failed = 0
            for _ in range(20):
                failed += await call(r) is not None
            assert failed >= 5, failed
            assert await cooling(r, ["bad", "ok2"], within=0.3) == {}

        asyncio.run(run())
    finally:
        for u in (limited, bad, ok):
            u.close()
