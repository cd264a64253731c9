"""A service instrumented with the OpenTelemetry Python SDK and its httpx instrumentation, calling
upstream endpoints and exporting its spans over OTLP (HTTP or gRPC) to vitals-otlp. No vitals code:
what vitals sees is what any OTel-instrumented client emits.

  httpx_client.py --otlp http://127.0.0.1:4318 --protocol http|grpc --target e0=http://127.0.0.1:9001 ...

Calls each target in turn at --rate calls a second (a --timeout each) until its standard input
closes; prints one JSON line per call ({"t", "target", "ok", "error"}), then flushes the exporter
and prints {"final": {"calls": N}}.
"""
import argparse
import json
import sys
import threading
import time

import httpx
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--otlp", help="the receiver's base URL (http://host:4318 or http://host:4317)")
    ap.add_argument("--protocol", choices=["http", "grpc", "console"], default="http")
    ap.add_argument("--service", default="checkout")
    ap.add_argument("--target", action="append", default=[], help="name=url")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--gzip", action="store_true")
    a = ap.parse_args()

    if a.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=a.otlp.rstrip("/") + "/v1/traces",
                                    compression=Compression.Gzip if a.gzip else Compression.NoCompression)
    elif a.protocol == "grpc":
        from grpc import Compression
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=a.otlp, insecure=True,
                                    compression=Compression.Gzip if a.gzip else Compression.NoCompression)
    else:
        exporter = ConsoleSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": a.service}))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()

    targets = [t.split("=", 1) for t in a.target]
    stop = threading.Event()

    def wait_stdin():
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    calls = 0
    with httpx.Client(timeout=a.timeout) as client:
        while not stop.is_set():
            for name, url in targets:
                if stop.is_set():
                    break
                t = time.time()
                ok, err = False, None
                try:
                    r = client.post(url.rstrip("/") + "/v1/chat/completions",
                                    json={"model": "sim", "messages": [{"role": "user", "content": "hi"}]})
                    ok = r.status_code < 400
                    err = None if ok else str(r.status_code)
                except Exception as e:  # the span records it; we only count
                    err = type(e).__name__
                calls += 1
                print(json.dumps({"t": t, "target": name, "ok": ok, "error": err}), flush=True)
                time.sleep(max(0.0, 1.0 / a.rate - (time.time() - t)))
    provider.force_flush()
    provider.shutdown()
    print(json.dumps({"final": {"calls": calls}}), flush=True)


if __name__ == "__main__":
    main()
