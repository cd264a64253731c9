-- Scoped health (docs/decisions.md, "Scoped health"): a transition may be for one scope of
-- reporters only (gateway=g1, location=eu, key=k1). NULL is the endpoint's fleet-wide state,
-- which every transition written before this migration is.
ALTER TABLE transitions ADD COLUMN scope text;
ALTER TABLE pool_events ADD COLUMN faulty_reporters text[] NOT NULL DEFAULT '{}';

-- The scoped decisions in force: an endpoint out for one scope. A scoped transition back into
-- rotation deletes its row; a fleet transition out of rotation (unhealthy, maintenance) deletes
-- every row of the endpoint older than it. Names compare as bytes, as in every key (0005).
CREATE TABLE scoped_state (
    pool text COLLATE "C" NOT NULL,
    endpoint text COLLATE "C" NOT NULL,
    scope text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    state text NOT NULL,
    weight double precision NOT NULL,
    retry_at timestamptz,
    since timestamptz NOT NULL,
    reason text NOT NULL,
    PRIMARY KEY (pool, endpoint, scope)
);
