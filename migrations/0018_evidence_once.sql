-- A transition's evidence is stored once, in `evidence`. Eight columns repeated what it holds
-- (failure_rate, score, window_failures, consecutive_failures, consecutive_successes,
-- ttft_p50_ms, ttft_p99_ms, thresholds): nothing reads them, and each transition paid for them
-- in its insert (eight more arrays to unnest, the thresholds parsed from an array literal) and
-- in the heap and the write-ahead log (store-bench, 13,406 transitions of e2e-bench's workload:
-- 2,266 -> 2,118 bytes of WAL a transition, everything the batch writes included). window_calls
-- stays: the history index carries it for the uptime report's index-only reads. Dropping a
-- column rewrites nothing; the space of old rows comes back as they go with their months.
ALTER TABLE transitions
    DROP COLUMN failure_rate,
    DROP COLUMN score,
    DROP COLUMN window_failures,
    DROP COLUMN consecutive_failures,
    DROP COLUMN consecutive_successes,
    DROP COLUMN ttft_p50_ms,
    DROP COLUMN ttft_p99_ms,
    DROP COLUMN thresholds;

-- The state projection is updated in place at every transition of an endpoint. With its pages
-- half full, the new version of a row usually fits on the row's own page: a heap-only update,
-- with no new entry in the primary key (13,406 updates of 10,000 rows in isolation: 8.2-8.3 µs
-- a row with full pages, 6.6-6.7 half full). Pages written from now on keep the room.
ALTER TABLE endpoint_state SET (fillfactor = 50);
