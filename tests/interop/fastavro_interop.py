#!/usr/bin/env python3
"""Interop peer for the vitals codec: an independent Avro implementation (fastavro) with the
single-object framing (C3 01 + CRC-64-AVRO fingerprint, little-endian) written by hand.

  fastavro_interop.py write SCHEMA.avsc JSON_RECORD OUT.bin   encode one record
  fastavro_interop.py read SCHEMA.avsc IN.bin                 decode one record, print it as JSON
"""
import io
import json
import sys

import fastavro
from fastavro.schema import parse_schema, to_parsing_canonical_form

EMPTY = 0xC15D213AA4D7A795
TABLE = []
for i in range(256):
    fp = i
    for _ in range(8):
        fp = (fp >> 1) ^ (EMPTY & -(fp & 1))
    TABLE.append(fp)


def crc64_avro(data: bytes) -> int:
    """The Avro specification's 64-bit Rabin fingerprint."""
    fp = EMPTY
    for b in data:
        fp = (fp >> 8) ^ TABLE[(fp ^ b) & 0xFF]
    return fp


def load(path):
    with open(path) as f:
        raw = json.load(f)
    parsed = parse_schema(raw)
    canonical = to_parsing_canonical_form(raw)
    return parsed, crc64_avro(canonical.encode()).to_bytes(8, "little")


def main():
    mode = sys.argv[1]
    schema, fp = load(sys.argv[2])
    if mode == "write":
        record = json.loads(sys.argv[3])
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, record)
        with open(sys.argv[4], "wb") as f:
            f.write(b"\xc3\x01" + fp + buf.getvalue())
    elif mode == "read":
        data = open(sys.argv[3], "rb").read()
        if data[:2] != b"\xc3\x01":
            sys.exit("bad magic")
        if data[2:10] != fp:
            sys.exit(f"fingerprint mismatch: {data[2:10].hex()} != {fp.hex()}")
        record = fastavro.schemaless_reader(io.BytesIO(data[10:]), schema, None)
        print(json.dumps(record, sort_keys=True, default=str))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
