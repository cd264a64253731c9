#!/usr/bin/env python3
"""The chart's pods, started as a kubelet would start them, on the local stack.

`helm template` renders deploy/helm/vitals with ci/start-values.yaml (every part on), pointed at
the test stack's Kafka and Postgres with topics and a schema of its own. Each workload's first
container is then run the way the kubelet runs it: its environment resolved in order (fieldRef,
secretKeyRef from the Secrets below, `$(VAR)` expanded from the variables before it), its
volumes mounted at their paths (emptyDir as tmpfs, ConfigMaps and Secrets as files), the binaries
at /usr/local/bin as in the image, the root file system read-only, as the image's user (10001),
in a mount namespace of its own. The processor starts first (it makes the topics and migrates the
schema); the others then; each must pass its readiness probe (the alerter, which has none, must
keep running), and each must exit 0 on SIGTERM within its pod's grace period.

The mount points are made as empty folders on the host (/etc/vitals/...), as the image has them.
Needs root (mount namespaces), the built binaries, helm and the stack: scripts/check-deploy.sh
runs it when the test command gives it the stack (VITALS_TEST_KAFKA, VITALS_TEST_DATABASE_URL,
VITALS_TEST_READER_DATABASE_URL).
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml  # PyYAML (scripts/install-deps.sh)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy/helm/vitals")
READY_DEADLINE_S = 240


def say(msg):
    print(f"[chart-start] {msg}", file=sys.stderr, flush=True)


def render(helm, kafka, suffix):
    sets = [
        f"kafka.brokers={kafka}",
        f"postgres.schema=chart_start_{suffix}",
        f"processor.group=chart-start-{suffix}",
    ]
    for t in ["signals", "changes", "state", "dlq", "gatewaySignals"]:
        sets.append(f"kafka.topics.{t}=chart-start-{suffix}.{t}")
    out = subprocess.run([helm, "template", "vitals", CHART, "-f", os.path.join(CHART, "ci/start-values.yaml"),
                          "--set", ",".join(sets)], capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


class Pod:
    def __init__(self, doc, secrets, configmaps, bin_dir):
        self.kind, self.name = doc["kind"], doc["metadata"]["name"]
        spec = doc["spec"]["template"]["spec"]
        self.container = spec["containers"][0]
        self.grace = spec.get("terminationGracePeriodSeconds", 30)
        self.user = spec.get("securityContext", {}).get("runAsUser", 10001)
        self.group = spec.get("securityContext", {}).get("runAsGroup", self.user)
        self.pod_name = f"{self.name}-0" if self.kind == "StatefulSet" else f"{self.name}-7d9f8-abcde"
        self.env = self.resolve_env(secrets)
        self.made = []
        self.mounts = self.volumes(spec.get("volumes", []), secrets, configmaps)
        self.bin_dir = bin_dir
        self.proc = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log", delete=False)

    def resolve_env(self, secrets):
        env = {}
        for e in self.container.get("env", []):
            if "value" in e:
                env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                        lambda m: env.get(m.group(1), m.group(0)), e["value"])
            elif "fieldRef" in e.get("valueFrom", {}):
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                if path != "metadata.name":
                    raise SystemExit(f"{self.name}: fieldRef {path} is not emulated here")
                env[e["name"]] = self.pod_name
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = secrets[ref["name"]][ref["key"]]
        return env

    def volumes(self, volumes, secrets, configmaps):
        by_name = {v["name"]: v for v in volumes}
        mounts = []
        for m in self.container.get("volumeMounts", []):
            v = by_name[m["name"]]
            if "emptyDir" in v:
                mounts.append(("tmpfs", m["mountPath"]))
                continue
            files = configmaps[v["configMap"]["name"]] if "configMap" in v else secrets[v["secret"]["secretName"]]
            d = tempfile.mkdtemp(prefix=f"vitals-vol-{m['name']}-")
            for key, text in files.items():
                with open(os.path.join(d, key), "w", encoding="utf-8") as f:
                    f.write(text)
            os.chmod(d, 0o755)
            for key in files:
                os.chmod(os.path.join(d, key), 0o444)
            mounts.append((d, m["mountPath"]))
            self.made.append(d)
        return mounts

    def start(self):
        script = [f"mount --bind {shlex.quote(self.bin_dir)} /usr/local/bin"]
        # Files first, then the empty folders: a tmpfs on /tmp would hide the files' sources.
        for src, path in sorted(self.mounts, key=lambda m: m[0] == "tmpfs"):
            if not path.startswith("/tmp"):
                os.makedirs(path, exist_ok=True)
            if src == "tmpfs":
                script.append(f"mount -t tmpfs -o size=64m,mode=1777 tmpfs {shlex.quote(path)}")
            else:
                script.append(f"mount --bind -o ro {shlex.quote(src)} {shlex.quote(path)}")
        script.append("mount -o remount,ro,bind /")
        cmd = self.container["command"] + self.container.get("args", [])
        script.append(f"exec setpriv --reuid={self.user} --regid={self.group} --clear-groups "
                      + " ".join(shlex.quote(c) for c in cmd))
        env = dict(self.env, PATH="/usr/local/bin:/usr/bin:/bin", HOSTNAME=self.pod_name)
        self.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-ec", "; ".join(script)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def ready_url(self):
        probe = self.container.get("readinessProbe", {}).get("httpGet")
        if not probe:
            return None
        port = probe["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in self.container["ports"] if p["name"] == port)
        return f"http://127.0.0.1:{port}{probe['path']}"

    def tail(self):
        self.log.flush()
        return open(self.log.name, encoding="utf-8", errors="replace").read()[-1500:]


def is_ready(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except Exception:
        return False


def wait_ready(pods, problems):
    deadline = time.monotonic() + READY_DEADLINE_S
    waiting = {p.name: p for p in pods}
    while waiting and time.monotonic() < deadline:
        for name, p in list(waiting.items()):
            if p.proc.poll() is not None:
                problems.append(f"{name} exited {p.proc.returncode} before it was ready:\n{p.tail()}")
                del waiting[name]
            elif (url := p.ready_url()) is None or is_ready(url):
                say(f"{name} ready" + (f" ({url})" if url else " (no probe; running)"))
                del waiting[name]
        time.sleep(0.5)
    for name, p in waiting.items():
        problems.append(f"{name} not ready after {READY_DEADLINE_S} s ({p.ready_url()}):\n{p.tail()}")


def main():
    kafka = os.environ["VITALS_TEST_KAFKA"]
    writer = os.environ["VITALS_TEST_DATABASE_URL"]
    reader = os.environ["VITALS_TEST_READER_DATABASE_URL"]
    helm = os.environ.get("VITALS_HELM", "/opt/vitals-helm/bin/helm")
    bin_dir = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release")
    suffix = f"{os.getpid()}_{int(time.time())}"
    docs = render(helm, kafka, suffix)
    secrets = {
        "vitals-postgres-writer": {"url": writer},
        "vitals-postgres-reader": {"url": reader},
        "vitals-api-tokens": {"tokens": "chart-start:admin:chart-start-admin-secret-0001\n"},
    }
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    pods = [Pod(d, secrets, configmaps, bin_dir) for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    problems = []
    first = [p for p in pods if p.container["name"] == "processor"]
    rest = [p for p in pods if p.container["name"] != "processor"]
    say(f"{len(pods)} workloads: {', '.join(p.name for p in pods)}")
    try:
        for group in (first, rest):
            for p in group:
                p.start()
            wait_ready(group, problems)
            if problems:
                break
        # The alerter has no probe: it must still run once the rest are ready.
        for p in pods:
            if p.proc and p.proc.poll() is not None and not any(p.name in x for x in problems):
                problems.append(f"{p.name} exited {p.proc.returncode} while the others started:\n{p.tail()}")
    finally:
        for p in reversed(pods):
            if p.proc and p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGTERM)
        for p in reversed(pods):
            if not p.proc:
                continue
            try:
                code = p.proc.wait(timeout=p.grace)
                if code != 0 and not problems:
                    problems.append(f"{p.name} exited {code} on SIGTERM:\n{p.tail()}")
            except subprocess.TimeoutExpired:
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait()
                problems.append(f"{p.name} did not stop within its grace period ({p.grace} s) of SIGTERM")
    for p in pods:
        for d in p.made:
            shutil.rmtree(d, ignore_errors=True)
        if not problems:
            os.unlink(p.log.name)
    for x in problems:
        say(f"PROBLEM {x}")
    if problems:
        sys.exit(1)
    say(f"{len(pods)} workloads started as the chart says, were ready, and stopped on SIGTERM")


if __name__ == "__main__":
    main()
