-- The policy in force per pool, written in the batch that applies a policy change, so that the
-- API reads a policy as data instead of decoding engine snapshots (which stay private to the
-- engine and the processor). Pools whose policy changed before this table existed get their row
-- when a processor next restores their partition. Names compare as bytes, as in every other key
-- (migration 0005).
CREATE TABLE pool_policies (
    pool        text COLLATE "C" PRIMARY KEY,
    version     bigint NOT NULL,
    policy      jsonb NOT NULL,
    stream_time timestamptz NOT NULL
);
