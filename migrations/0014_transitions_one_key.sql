-- A transition is the audit log's most written row (e2e-bench, 5 M signals: 42 % of Postgres'
-- statement time) and each one went into four B-trees: the primary key (pool, endpoint, seq,
-- stream_time) and the history index (pool, endpoint, stream_time DESC, seq DESC) hold the same
-- columns in another order. The history index is now the unique key: ON CONFLICT (pool, endpoint,
-- seq, stream_time) infers it (inference ignores the order), replays still land each row once,
-- and each transition goes into three B-trees. Inserting the 100,800 transitions of that run:
-- 2.55 s with four, 1.82 s with three. The last transition of an endpoint is read by this index
-- (newest stream time, then seq: an endpoint's seq grows with its stream time). Rebuilding the
-- index takes a while on a large log (about 20 s for 10 M rows here).
SET LOCAL statement_timeout = 0;
ALTER TABLE transitions DROP CONSTRAINT transitions_pkey;
DROP INDEX transitions_by_endpoint;
CREATE UNIQUE INDEX transitions_by_endpoint ON transitions (pool, endpoint, stream_time DESC, seq DESC)
    INCLUDE (from_state, to_state, weight, reason_code, window_calls);
