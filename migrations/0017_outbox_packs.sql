-- The outbox holds packs: one row carries every event a batch publishes (up to a bound), in
-- order, framed in `messages`, where it held one row per event. A transition put two or three
-- rows in the outbox (its change, its state record, its endpoint's discovery) and each row cost
-- a heap tuple, an index entry, a WAL record, then a delete and a vacuum: 275 events inserted and
-- deleted as rows took 4.0-5.5 ms of Postgres in isolation, as one pack 0.6-0.7 ms. `events`
-- counts the messages of a row, so that the relay can take a round's worth and the backlog is
-- counted in events. Rows written one event a row (by a processor before this migration, or
-- waiting when it ran) keep their columns and are published in id order with the packs.
ALTER TABLE outbox ADD COLUMN messages bytea;
ALTER TABLE outbox ADD COLUMN events integer NOT NULL DEFAULT 1;
ALTER TABLE outbox ALTER COLUMN dedup_key DROP NOT NULL;
ALTER TABLE outbox ALTER COLUMN topic DROP NOT NULL;
ALTER TABLE outbox ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE outbox ADD CONSTRAINT outbox_one_event_or_a_pack CHECK (
    CASE WHEN messages IS NULL THEN dedup_key IS NOT NULL AND topic IS NOT NULL AND payload IS NOT NULL AND events = 1
         ELSE dedup_key IS NULL AND topic IS NULL AND payload IS NULL AND events >= 1 END);
-- A pack is tens to hundreds of kilobytes of Avro and JSON headers: compressed with lz4 (several
-- times faster than the default pglz), stored out of line.
ALTER TABLE outbox ALTER COLUMN messages SET COMPRESSION lz4;
