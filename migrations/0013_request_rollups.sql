-- Request availability: the calls users felt, counted by endpoint and minute of stream time from
-- every call and summary the processor reads (succeeded, failed, rate limited, neutral). A batch
-- adds its partition's counts and moves that partition's counted offset (requests_offset) in
-- the same transaction, fenced by the epoch like next_offset: each record's calls are counted
-- once however often it is replayed. An hourly table beside the minutes keeps long ranges cheap
-- to read. Both are partitioned by month like the audit log and dropped with its months.

CREATE TABLE request_rollups (
    pool         text COLLATE "C" NOT NULL,
    endpoint     text COLLATE "C" NOT NULL,
    minute       timestamptz NOT NULL,
    succeeded    bigint NOT NULL,
    failed       bigint NOT NULL,
    rate_limited bigint NOT NULL,
    neutral      bigint NOT NULL,
    PRIMARY KEY (pool, endpoint, minute)
) PARTITION BY RANGE (minute);

CREATE TABLE request_rollups_hourly (
    pool         text COLLATE "C" NOT NULL,
    endpoint     text COLLATE "C" NOT NULL,
    hour         timestamptz NOT NULL,
    succeeded    bigint NOT NULL,
    failed       bigint NOT NULL,
    rate_limited bigint NOT NULL,
    neutral      bigint NOT NULL,
    PRIMARY KEY (pool, endpoint, hour)
) PARTITION BY RANGE (hour);

-- The first offset of each partition whose calls are not counted yet. A partition written before
-- this migration starts counting at its next offset when it is next claimed (-1 until then).
ALTER TABLE consumer_offsets ADD COLUMN requests_offset bigint NOT NULL DEFAULT -1;

CREATE OR REPLACE FUNCTION vitals_month_partitions(lo timestamptz, hi timestamptz) RETURNS integer
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
        FOREACH t IN ARRAY ARRAY['transitions', 'pool_events', 'request_rollups', 'request_rollups_hourly'] LOOP
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

CREATE OR REPLACE FUNCTION vitals_drop_months_before(cutoff timestamptz) RETURNS SETOF text
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
          AND p.relname IN ('transitions', 'pool_events', 'request_rollups', 'request_rollups_hourly')
          AND c.relname ~ '_y[0-9]{4}m[0-9]{2}$'
          AND (to_date(substring(c.relname from '_y([0-9]{4}m[0-9]{2})$'), 'YYYY"m"MM')::timestamp
               + interval '1 month') AT TIME ZONE 'UTC' <= cutoff
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I.%I', current_schema(), r.relname);
        RETURN NEXT r.relname;
    END LOOP;
END $$;

-- The months the audit log has (each, not the gaps between them) get their rollup tables too.
SELECT vitals_month_partitions(m, m)
FROM (SELECT DISTINCT to_date(substring(c.relname from '_y([0-9]{4}m[0-9]{2})$'), 'YYYY"m"MM')::timestamp AT TIME ZONE 'UTC' AS m
      FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid
      JOIN pg_class p ON p.oid = i.inhparent
      WHERE p.relnamespace = current_schema()::regnamespace AND p.relname = 'transitions'
        AND c.relname ~ '_y[0-9]{4}m[0-9]{2}$') months;
