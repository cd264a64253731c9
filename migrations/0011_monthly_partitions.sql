-- The audit log at fleet scale: transitions and pool events are range-partitioned by month of
-- stream time, so that retention drops whole months (no DELETE, no vacuum debt) and a query over
-- a time range reads only the months it covers.
--
-- The key now includes stream_time (a partitioned table's unique keys must contain the partition
-- key). Writes stay idempotent: the engine is deterministic, so a replayed transition has the
-- same seq *and* the same stream_time as the first time, and ON CONFLICT on the wider key still
-- lands each row once.
--
-- Months are created by vitals_month_partitions(from, to), which the processor calls before a
-- batch whose rows fall in a month it has not seen (and one month ahead); there is deliberately no
-- DEFAULT partition (a month that had rows there could no longer be created). Retention:
-- vitals_drop_months_before(t) drops every month that ended by t. Existing rows are moved here,
-- in one transaction (10 M rows: see docs/benchmarks.md), without the writer's statement timeout.
SET LOCAL statement_timeout = 0;

CREATE FUNCTION vitals_month_partitions(lo timestamptz, hi timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    m timestamp;
    t text;
    name text;
    made integer := 0;
BEGIN
    IF lo IS NULL OR hi IS NULL THEN
        RETURN 0;
    END IF;
    -- Two processors reaching a new month at once: one creates it, the other finds it.
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.vitals_month_partitions'));
    m := date_trunc('month', lo AT TIME ZONE 'UTC');
    WHILE m <= (hi AT TIME ZONE 'UTC') LOOP
        FOREACH t IN ARRAY ARRAY['transitions', 'pool_events'] LOOP
            name := t || to_char(m, '"_y"YYYY"m"MM');
            IF to_regclass(format('%I.%I', current_schema(), name)) IS NULL THEN
                EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
                    current_schema(), name, current_schema(), t,
                    m AT TIME ZONE 'UTC', (m + interval '1 month') AT TIME ZONE 'UTC');
                made := made + 1;
            END IF;
        END LOOP;
        m := m + interval '1 month';
    END LOOP;
    RETURN made;
END $$;

-- Drops the months of transitions and pool events that ended by `cutoff`; returns their names.
CREATE FUNCTION vitals_drop_months_before(cutoff timestamptz) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.vitals_month_partitions'));
    FOR r IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relnamespace = current_schema()::regnamespace
          AND p.relname IN ('transitions', 'pool_events')
          AND c.relname ~ '_y[0-9]{4}m[0-9]{2}$'
          AND (to_date(substring(c.relname from '_y([0-9]{4}m[0-9]{2})$'), 'YYYY"m"MM')::timestamp
               + interval '1 month') AT TIME ZONE 'UTC' <= cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I.%I', current_schema(), r.relname);
        RETURN NEXT r.relname;
    END LOOP;
END $$;

-- Grants on the old tables carry over to the new ones (a reader role given SELECT by hand).
CREATE FUNCTION pg_temp.copy_grants(from_table text, to_table text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole::text AS grantee, a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = format('%I.%I', current_schema(), from_table)::regclass
          AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON %I TO %s', r.privilege_type, to_table, r.grantee);
    END LOOP;
END $$;

ALTER TABLE transitions RENAME TO transitions_unpartitioned;
ALTER TABLE pool_events RENAME TO pool_events_unpartitioned;
CREATE TABLE transitions (LIKE transitions_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (stream_time);
CREATE TABLE pool_events (LIKE pool_events_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (stream_time);
SELECT pg_temp.copy_grants('transitions_unpartitioned', 'transitions');
SELECT pg_temp.copy_grants('pool_events_unpartitioned', 'pool_events');

-- The months that have rows (both tables get each month).
SELECT vitals_month_partitions(m, m)
FROM (SELECT DISTINCT date_trunc('month', stream_time AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS m
      FROM (SELECT stream_time FROM transitions_unpartitioned
            UNION ALL SELECT stream_time FROM pool_events_unpartitioned) t) months;
INSERT INTO transitions SELECT * FROM transitions_unpartitioned;
INSERT INTO pool_events SELECT * FROM pool_events_unpartitioned;
DROP TABLE transitions_unpartitioned;
DROP TABLE pool_events_unpartitioned;

-- The keys and indexes of before, with stream_time in the keys; built after the rows are in.
ALTER TABLE transitions ADD PRIMARY KEY (pool, endpoint, seq, stream_time);
ALTER TABLE pool_events ADD PRIMARY KEY (pool, seq, stream_time);
CREATE INDEX transitions_by_endpoint ON transitions (pool, endpoint, stream_time DESC, seq DESC)
    INCLUDE (from_state, to_state, weight, reason_code, window_calls);
CREATE INDEX transitions_by_pool ON transitions (pool, stream_time DESC, endpoint DESC, seq DESC);
CREATE INDEX transitions_by_time ON transitions (stream_time DESC, pool DESC, endpoint DESC, seq DESC);
CREATE INDEX pool_events_by_time ON pool_events (pool, stream_time, seq);
ANALYZE transitions;
ANALYZE pool_events;
