-- A transition's evidence, and an outbox row's headers, are stored as json (checked text)
-- instead of jsonb. Nothing queries inside them: they are written once and read back whole.
-- Converting to jsonb cost Postgres more than anything else about a transition: 13,406
-- transitions of e2e-bench inserted as the writer inserts them took 365-399 ms with jsonb,
-- 236-281 ms with json (the evidence is ~500 bytes of JSON); json is also ~25 % smaller on
-- disk and in the write-ahead log. The change rewrites the transitions table (about a minute
-- for 10 M rows).
SET LOCAL statement_timeout = 0;
ALTER TABLE transitions ALTER COLUMN evidence TYPE json USING evidence::json;
ALTER TABLE outbox ALTER COLUMN headers DROP DEFAULT;
ALTER TABLE outbox ALTER COLUMN headers TYPE json USING headers::json;
ALTER TABLE outbox ALTER COLUMN headers SET DEFAULT '{}';
