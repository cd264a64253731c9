-- Leadership of the outbox relay: a lease that its holder renews every second and that expires
-- by itself. (A session advisory lock, used before, stayed held while its holder was frozen, so
-- nothing was published although other processors kept committing.)
CREATE TABLE relay_lease (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
