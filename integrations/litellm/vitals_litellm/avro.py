"""vitals' records in the Avro single-object encoding: C3 01, the schema's CRC-64-AVRO fingerprint
(8 bytes, little-endian), then the Avro binary body. The schemas ship in this package; they are
copies of the repository's `schemas/` (a test holds them identical)."""

from __future__ import annotations

import io
import json
from importlib import resources

import fastavro
from fastavro.schema import parse_schema, to_parsing_canonical_form

_EMPTY = 0xC15D213AA4D7A795


def _table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _table()


def fingerprint(canonical: str) -> bytes:
    """The Avro specification's 64-bit Rabin fingerprint of a schema's canonical form."""
    fp = _EMPTY
    for b in canonical.encode():
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp.to_bytes(8, "little")


class Schema:
    """One of the package's schemas, by file name (e.g. `call_outcome.avsc`)."""

    def __init__(self, file_name: str):
        raw = json.loads(resources.files(__package__).joinpath("schemas", file_name).read_text())
        self.name: str = raw["name"]
        self.parsed = parse_schema(raw)
        self.fingerprint = fingerprint(to_parsing_canonical_form(raw))
        self._header = b"\xc3\x01" + self.fingerprint

    def encode(self, record: dict) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, self.parsed, record)
        return self._header + body.getvalue()

    def decode(self, data: bytes) -> dict:
        return fastavro.schemaless_reader(io.BytesIO(data[10:]), self.parsed)


CALL_OUTCOME = Schema("call_outcome.avsc")
HEALTH_CHANGED = Schema("health_changed.avsc")
POOL_HEALTH_CHANGED = Schema("pool_health_changed.avsc")
ENDPOINT_STATE = Schema("endpoint_state.avsc")

# The processor writes a fleet transition in version 1 (no scope) and a scoped one in version 2;
# both are read here, a version 1 record with no scope.
_BY_FINGERPRINT = {
    s.fingerprint: s
    for s in (
        HEALTH_CHANGED, Schema("health_changed.v1.avsc"), POOL_HEALTH_CHANGED,
        Schema("pool_health_changed.v1.avsc"), ENDPOINT_STATE,
    )
}


def decode_health(data: bytes | None) -> tuple[str | None, dict | None]:
    """(record name, record) for a HealthChanged, PoolHealthChanged or EndpointState; (None, None)
    for any other kind (a Tick) or bytes that do not decode."""
    if not data or len(data) < 10 or data[:2] != b"\xc3\x01":
        return None, None
    schema = _BY_FINGERPRINT.get(bytes(data[2:10]))
    if schema is None:
        return None, None
    try:
        return schema.name, schema.decode(data)
    except Exception:  # noqa: BLE001 - a record that does not decode is skipped, never raised
        return None, None
