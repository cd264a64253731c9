-- Text keys compare as bytes (COLLATE "C"), whatever the cluster's locale. Under a libc locale
-- (even C.UTF-8, which PostgreSQL 15 does not treat as C) every index comparison of a pool or
-- endpoint name went through strcoll, on every insert of every batch. Byte order is also the
-- order the engine and the API's cursors use (Rust compares strings as bytes), and for UTF-8 it
-- equals code-point order, so no ordering a reader relied on changes. Indexes are rebuilt; the
-- tables are not rewritten.
ALTER TABLE transitions
    ALTER COLUMN pool TYPE text COLLATE "C",
    ALTER COLUMN endpoint TYPE text COLLATE "C";
ALTER TABLE pool_events
    ALTER COLUMN pool TYPE text COLLATE "C";
ALTER TABLE endpoint_state
    ALTER COLUMN pool TYPE text COLLATE "C",
    ALTER COLUMN endpoint TYPE text COLLATE "C";
ALTER TABLE consumer_offsets
    ALTER COLUMN consumer_group TYPE text COLLATE "C",
    ALTER COLUMN topic TYPE text COLLATE "C";
ALTER TABLE partition_snapshots
    ALTER COLUMN consumer_group TYPE text COLLATE "C",
    ALTER COLUMN topic TYPE text COLLATE "C";
ALTER TABLE engine_snapshots
    ALTER COLUMN consumer_group TYPE text COLLATE "C",
    ALTER COLUMN topic TYPE text COLLATE "C",
    ALTER COLUMN pool TYPE text COLLATE "C";
