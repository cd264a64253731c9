#!/usr/bin/env python3
"""Interop peer for the vitals codec: an independent Avro implementation (fastavro) with the
single-object framing (C3 01 + CRC-64-AVRO fingerprint, little-endian) written by hand — the
framing of examples/python/vitals_avro.py, which these tests thereby check too.

  fastavro_interop.py write SCHEMA.avsc JSON_RECORD OUT.bin   encode one record
  fastavro_interop.py read SCHEMA.avsc IN.bin                 decode one record, print it as JSON
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from vitals_avro import Schema  # noqa: E402


def main():
    mode = sys.argv[1]
    schema = Schema(os.path.abspath(sys.argv[2]))
    if mode == "write":
        record = json.loads(sys.argv[3])
        with open(sys.argv[4], "wb") as f:
            f.write(schema.encode(record))
    elif mode == "read":
        data = open(sys.argv[3], "rb").read()
        if data[:2] != b"\xc3\x01":
            sys.exit("bad magic")
        if data[2:10] != schema.fingerprint:
            sys.exit(f"fingerprint mismatch: {data[2:10].hex()} != {schema.fingerprint.hex()}")
        print(json.dumps(schema.decode(data), sort_keys=True, default=str))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
