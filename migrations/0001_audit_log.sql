-- vitals: the audit log of health transitions and everything the processor needs to resume
-- exactly once. Every write the processor makes is idempotent (unique keys + ON CONFLICT), so a
-- replay from an older snapshot lands each row once.

-- One row per endpoint transition, with its evidence. (pool, endpoint, seq) is the identity:
-- seq is the per-endpoint sequence number the engine assigns.
CREATE TABLE transitions (
    pool                  text             NOT NULL,
    endpoint              text             NOT NULL,
    seq                   bigint           NOT NULL,
    transition_id         text             NOT NULL,
    from_state            text             NOT NULL,
    to_state              text             NOT NULL,
    weight                double precision NOT NULL,
    ramp_ms               bigint           NOT NULL,
    retry_at              timestamptz,
    reason_code           text             NOT NULL,
    reason                text             NOT NULL,
    failure_rate          double precision NOT NULL,
    score                 double precision NOT NULL,
    window_calls          bigint           NOT NULL,
    window_failures       bigint           NOT NULL,
    consecutive_failures  integer          NOT NULL,
    consecutive_successes integer          NOT NULL,
    ttft_p50_ms           double precision,
    ttft_p99_ms           double precision,
    thresholds            text[]           NOT NULL,
    trigger_ids           text[]           NOT NULL,
    policy_version        integer          NOT NULL,
    evidence              jsonb            NOT NULL,
    stream_time           timestamptz      NOT NULL,
    source_partition      integer          NOT NULL,
    source_offset         bigint           NOT NULL,
    recorded_at           timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, endpoint, seq)
);
-- History by endpoint, by pool and fleet-wide, newest first. Every key column runs the same way
-- so that keyset pagination is one row comparison: (stream_time, pool, endpoint, seq) < cursor.
CREATE INDEX transitions_by_endpoint ON transitions (pool, endpoint, stream_time DESC, seq DESC);
CREATE INDEX transitions_by_pool ON transitions (pool, stream_time DESC, endpoint DESC, seq DESC);
CREATE INDEX transitions_by_time ON transitions (stream_time DESC, pool DESC, endpoint DESC, seq DESC);

-- Pool-level decisions: panic mode, correlated-outage suspicion, policy changes.
CREATE TABLE pool_events (
    pool              text             NOT NULL,
    seq               bigint           NOT NULL,
    endpoints         integer          NOT NULL,
    healthy           integer          NOT NULL,
    ejected           integer          NOT NULL,
    healthy_fraction  double precision NOT NULL,
    panic             boolean          NOT NULL,
    correlated_outage boolean          NOT NULL,
    reason            text             NOT NULL,
    policy_version    integer          NOT NULL,
    stream_time       timestamptz      NOT NULL,
    source_partition  integer          NOT NULL,
    source_offset     bigint           NOT NULL,
    recorded_at       timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, seq)
);

-- The latest state of every endpoint the engine knows: the projection the API reads. An endpoint
-- appears with seq 0 when first seen; each transition replaces the row.
CREATE TABLE endpoint_state (
    pool           text             NOT NULL,
    endpoint       text             NOT NULL,
    seq            bigint           NOT NULL,
    state          text             NOT NULL,
    weight         double precision NOT NULL,
    ramp_ms        bigint           NOT NULL,
    score          double precision NOT NULL,
    failure_rate   double precision NOT NULL,
    since          timestamptz      NOT NULL,
    reason         text             NOT NULL,
    policy_version integer          NOT NULL,
    PRIMARY KEY (pool, endpoint)
);

-- Where each input partition stands. next_offset is the first offset not yet in this database;
-- epoch fences a processor that lost the partition in a rebalance.
CREATE TABLE consumer_offsets (
    consumer_group text    NOT NULL,
    topic          text    NOT NULL,
    partition      integer NOT NULL,
    next_offset    bigint  NOT NULL,
    epoch          bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer_group, topic, partition)
);

-- Engine snapshots: one row per pool, all rows of a partition taken at the same offset.
-- Recovery = these rows + a replay from snapshot_offset up to next_offset.
CREATE TABLE partition_snapshots (
    consumer_group  text    NOT NULL,
    topic           text    NOT NULL,
    partition       integer NOT NULL,
    snapshot_offset bigint  NOT NULL,
    stream_time     bigint  NOT NULL,
    PRIMARY KEY (consumer_group, topic, partition)
);
CREATE TABLE engine_snapshots (
    consumer_group text    NOT NULL,
    topic          text    NOT NULL,
    partition      integer NOT NULL,
    pool           text    NOT NULL,
    state          bytea   NOT NULL,
    PRIMARY KEY (consumer_group, topic, partition, pool)
);

-- Transactional outbox: events to publish, written in the same transaction as the audit rows.
-- dedup_key makes a replayed insert a no-op; published rows are kept (and pruned by age) so a
-- replay does not publish them again.
CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    dedup_key    text        NOT NULL UNIQUE,
    topic        text        NOT NULL,
    key          bytea,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
