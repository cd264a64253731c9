"""A proxyless gRPC client in Python (grpcio's C-core xDS client) following vitals-xds, with no
vitals code in it: one call of the standard health service to TARGET (xds:///POOL, with
GRPC_XDS_BOOTSTRAP naming vitals-xds) every INTERVAL seconds, a line per call "UNIX_MS PEER" or
"UNIX_MS ERR CODE", until standard input closes.

    python3 client.py xds:///POOL 0.02
"""

import sys
import threading
import time

import grpc


def main() -> None:
    target, interval = sys.argv[1], float(sys.argv[2])
    done = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    channel = grpc.insecure_channel(target)
    # /grpc.health.v1.Health/Check with an empty HealthCheckRequest: raw bytes, no generated code.
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    n = 0
    while not done.wait(interval):
        try:
            _, call = check.with_call(b"", timeout=2)
            # The upstream names itself in a header (tools/xds-clients' upstreams).
            upstream = dict(call.initial_metadata()).get("upstream", "unknown")
            line = f"{int(time.time() * 1000)} {upstream}"
        except grpc.RpcError as e:
            line = f"{int(time.time() * 1000)} ERR {e.code().name}"
        print(line, flush=(n % 10 == 0))
        n += 1
    sys.stdout.flush()


if __name__ == "__main__":
    main()
