-- The outbox becomes a queue: the relay deletes a row once Kafka has acknowledged it, so the
-- table holds only what is still to publish, and publishing costs no new row version and no
-- index entries (marking rows published rewrote each row and its index entries, and the table
-- and its indexes grew with the run). Replays no longer rely on a unique key to stay silent: a
-- restored partition emits nothing for records below its committed offset, and the epoch fence
-- keeps two owners from committing the same offsets. dedup_key stays as the event's identity
-- (in logs and for operators), without the unique index that every insert paid for.
DELETE FROM outbox WHERE published_at IS NOT NULL;
ALTER TABLE outbox DROP CONSTRAINT outbox_dedup_key_key;
DROP INDEX outbox_unpublished;
ALTER TABLE outbox DROP COLUMN published_at;
