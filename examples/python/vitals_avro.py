"""The Avro single-object encoding of vitals' contracts, in a few lines of Python.

A record on a vitals topic is C3 01, the schema's CRC-64-AVRO fingerprint (8 bytes,
little-endian), then the Avro binary body (the Avro specification, "Single-object encoding").
The schemas are the files in schemas/ at the top of the repository.
"""
import io
import json
import os

import fastavro
from fastavro.schema import parse_schema, to_parsing_canonical_form

SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")

_EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (_EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def fingerprint(canonical: str) -> bytes:
    """The Avro specification's 64-bit Rabin fingerprint of a schema's canonical form."""
    fp = _EMPTY
    for b in canonical.encode():
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp.to_bytes(8, "little")


class Schema:
    def __init__(self, file_name: str):
        """A schema of schemas/ by file name (or any .avsc by path)."""
        with open(os.path.join(SCHEMAS, file_name)) as f:
            raw = json.load(f)
        self.name = raw["name"]
        self.parsed = parse_schema(raw)
        self.fingerprint = fingerprint(to_parsing_canonical_form(raw))

    def encode(self, record: dict) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, self.parsed, record)
        return b"\xc3\x01" + self.fingerprint + body.getvalue()

    def decode(self, data: bytes) -> dict:
        return fastavro.schemaless_reader(io.BytesIO(data[10:]), self.parsed)


def by_fingerprint(*file_names: str) -> dict:
    """Schemas keyed by fingerprint, to tell apart the record kinds that share a topic."""
    schemas = [Schema(n) for n in file_names]
    return {s.fingerprint: s for s in schemas}


def decode_any(schemas: dict, data: bytes):
    """(schema, record) for a single-object record, or (None, None) for an unknown kind."""
    if len(data) < 10 or data[:2] != b"\xc3\x01":
        return None, None
    schema = schemas.get(data[2:10])
    return (schema, schema.decode(data)) if schema else (None, None)
