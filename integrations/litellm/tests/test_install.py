"""The documented install, from a bare virtual environment: `pip install "vitals-litellm[proxy]"`
gives a `litellm` that starts the proxy with the vitals callback and reports a call through it.
Slow (a whole install, from pip's cache when it is warm); the test command runs it."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from fake_ingest import Ingest
from fake_upstream import Upstream
from test_proxy import KEY, free_port

PACKAGE = pathlib.Path(__file__).resolve().parents[1]


def test_the_proxy_extra_installs_what_litellm_config_needs_from_a_bare_virtualenv():
    venv = pathlib.Path(tempfile.mkdtemp(prefix="vitals-litellm-bare-")) / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # A copy of the package: building in the checkout would leave build/ and *.egg-info behind.
    src = venv.parent / "vitals-litellm"
    subprocess.run(["cp", "-r", str(PACKAGE), str(src)], check=True)
    subprocess.run(["rm", "-rf", str(src / "tests"), str(src / "build")], check=True)
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                              f"{src}[proxy]"], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    up, ingest = Upstream("ok"), Ingest()
    port = free_port()
    cfg = venv.parent / "config.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: chat\n"
        f"    litellm_params: {{model: openai/sim, api_base: '{up.url}', api_key: none}}\n"
        "    model_info: {id: chat-a}\n"
        "litellm_settings:\n  callbacks: vitals_litellm.callback\n"
        f"general_settings:\n  master_key: {KEY}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VITALS_TRANSPORT="http", VITALS_INGEST_URL=ingest.url, VITALS_ROUTING="off", VITALS_WARMUP="report",
               LITELLM_LOCAL_MODEL_COST_MAP="True")
    log = venv.parent / "proxy.log"
    proxy = subprocess.Popen([str(venv / "bin" / "litellm"), "--config", str(cfg), "--host", "127.0.0.1",
                              "--port", str(port)], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        body = json.dumps({"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
        while True:
            assert proxy.poll() is None, f"the proxy stopped: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the proxy did not answer: {log.read_text()[-3000:]}"
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(),
                                         headers={"authorization": f"Bearer {KEY}",
                                                  "content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    assert r.status == 200
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        end = time.monotonic() + 30
        while not ingest.received() and time.monotonic() < end:
            time.sleep(0.1)
        got = ingest.received()
        assert got and got[0]["pool"] == "chat" and got[0]["endpoint"] == "chat-a", got
    finally:
        proxy.terminate()
        proxy.wait(30)
        up.close()
        ingest.close()
        subprocess.run(["rm", "-rf", str(venv.parent)])
