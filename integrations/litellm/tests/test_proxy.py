"""The plug-in in the real LiteLLM proxy (`litellm --config`, the version pinned in pyproject.toml),
reporting over HTTP to a stand-in for vitals' ingest: every attempt of a retried call is reported
once and blamed on the deployment that made it, and a streamed answer's first content token is
timed, not its empty first chunk."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from fake_ingest import Ingest
from fake_upstream import Upstream

HERE = pathlib.Path(__file__).resolve().parent
KEY = "sk-vitals-proxy-test-5b1e"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Proxy:
    def __init__(self, deployments, ingest_url, num_retries):
        self.port = free_port()
        lines = ["model_list:"]
        for group, name, url in deployments:
            lines += [f"  - model_name: {group}",
                      f"    litellm_params: {{model: openai/sim, api_base: '{url}', api_key: none}}",
                      f"    model_info: {{id: '{name}'}}"]
        lines += ["litellm_settings:", "  callbacks: vitals_litellm.callback",
                  "router_settings:", f"  num_retries: {num_retries}", "  disable_cooldowns: true",
                  "general_settings:", f"  master_key: {KEY}"]
        self.dir = tempfile.mkdtemp(prefix="vitals-proxy-")
        cfg = pathlib.Path(self.dir) / "config.yaml"
        cfg.write_text("\n".join(lines) + "\n")
        self.log = pathlib.Path(self.dir) / "proxy.log"
        env = dict(os.environ, VITALS_TRANSPORT="http", VITALS_INGEST_URL=ingest_url, VITALS_ROUTING="off", VITALS_WARMUP="report",
                   VITALS_GATEWAY="proxy-test", LITELLM_LOCAL_MODEL_COST_MAP="True")
        litellm = pathlib.Path(sys.executable).parent / "litellm"
        self.proc = subprocess.Popen([str(litellm), "--config", str(cfg), "--host", "127.0.0.1",
                                      "--port", str(self.port)], env=env, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2).read()
                return
            except (urllib.error.URLError, OSError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"the proxy did not start: {self.log.read_text()[-2000:]}")
                time.sleep(0.3)

    def call(self, model, stream=False):
        body = json.dumps({"model": model, "stream": stream, "max_tokens": 2,
                           "messages": [{"role": "user", "content": "x"}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
                                     headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def close(self):
        self.proc.terminate()  # the plug-in flushes its reports at exit
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def proxied():
    bad, good, slow = Upstream("503"), Upstream("ok"), Upstream("ok", ttft_s=0.6)
    ingest = Ingest()
    proxy = Proxy([("chat", "bad", bad.url), ("chat", "good", good.url), ("slow", "slow-first", slow.url)],
                  ingest.url, num_retries=1)
    yield proxy, ingest, bad, good
    proxy.close()
    for x in (bad, good, slow, ingest):
        x.close()


def wait_for(what, f, within=30.0):
    end = time.monotonic() + within
    while not f():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_every_attempt_of_a_retried_call_is_reported_once_and_blamed_on_its_deployment(proxied):
    proxy, ingest, bad, good = proxied
    statuses = Counter(proxy.call("chat", stream=i % 2 == 0) for i in range(40))
    attempts = bad.requests + good.requests
    assert attempts > 40, f"some calls were retried: {attempts} attempts for 40 calls"
    wait_for("a report of every attempt",
             lambda: sum(1 for i in ingest.received() if i["pool"] == "chat") >= attempts)
    time.sleep(0.5)  # and no more than that
    got = Counter((i["endpoint"], i["outcome"]) for i in ingest.received() if i["pool"] == "chat")
    assert got == {("bad", "server_error"): bad.requests, ("good", "success"): good.requests}, (got, statuses)


def test_the_proxy_reports_the_first_content_token(proxied):
    proxy, ingest, _, _ = proxied
    for _ in range(3):
        assert proxy.call("slow", stream=True) == 200
    wait_for("three reports", lambda: sum(1 for i in ingest.received() if i["pool"] == "slow") >= 3)
    for i in (x for x in ingest.received() if x["pool"] == "slow"):
        assert i["ttft_us"] is not None and 600_000 <= i["ttft_us"] < i["latency_us"], i
