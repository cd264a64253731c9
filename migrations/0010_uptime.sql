-- Uptime needs to know since when an endpoint exists: the state projection keeps the time it was
-- first seen (set on insert, never updated). Endpoints known before this migration get their
-- first transition's time, or the time of their current state when they have none: a lower
-- bound the audit log can prove.
ALTER TABLE endpoint_state ADD COLUMN first_seen timestamptz;
UPDATE endpoint_state e SET first_seen = LEAST(
    e.since,
    (SELECT min(t.stream_time) FROM transitions t WHERE t.pool = e.pool AND t.endpoint = e.endpoint));

-- The pool's flags at a range's start and over it, without a scan of its decisions.
CREATE INDEX pool_events_by_time ON pool_events (pool, stream_time, seq);
