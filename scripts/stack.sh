#!/usr/bin/env bash
# The local stack for vitals: a single-node Apache Kafka broker (KRaft, no ZooKeeper) and PostgreSQL 15,
# both on 127.0.0.1, with their data under .local/ (git-ignored).
#
#   scripts/stack.sh up      start both (idempotent: reuses what is already running), wait for readiness
#   scripts/stack.sh down    stop both
#   scripts/stack.sh status  say what is running
#   scripts/stack.sh am-up   also start Prometheus Alertmanager (Debian's prometheus-alertmanager) on
#                            127.0.0.1:$VITALS_AM_PORT with deploy/alertmanager/alertmanager.yml, for
#                            trying vitals-alerter; am-down stops it (so does down)
#   scripts/stack.sh am-run CONFIG PORT STORAGE
#                            run an Alertmanager in the foreground (exec: the caller owns the process;
#                            the alerter's tests start, kill and restart theirs with it)
#
# Environment (defaults): VITALS_KAFKA_PORT=9092, VITALS_KAFKA_CONTROLLER_PORT=9093,
# VITALS_PG_PORT=5432, VITALS_PG_USER=vitals, VITALS_PG_PASSWORD=vitals, VITALS_PG_DB=vitals,
# VITALS_PG_READER_USER=vitals_reader, VITALS_PG_READER_PASSWORD=vitals_reader.
#
# Roles: $VITALS_PG_USER owns the database and the schemas (the processor creates and migrates
# them and writes the audit log); $VITALS_PG_READER_USER may only read them (the API runs as it).
#
# The cluster lives in .local/pg when the postgres user can reach that folder. When it cannot (a
# clone in a home directory of mode 700), it lives in /var/lib/postgresql/vitals-<hash of the
# clone's path> instead, and .local/pg-location says where.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCAL="$ROOT/.local"
CACHE="$ROOT/.cache/kafka"
KAFKA_PORT=${VITALS_KAFKA_PORT:-9092}
CTRL_PORT=${VITALS_KAFKA_CONTROLLER_PORT:-9093}
PG_PORT=${VITALS_PG_PORT:-5432}
PG_USER=${VITALS_PG_USER:-vitals}
PG_PASSWORD=${VITALS_PG_PASSWORD:-vitals}
PG_DB=${VITALS_PG_DB:-vitals}
PG_VERSION=15
PG_BIN=/usr/lib/postgresql/$PG_VERSION/bin
PG_READER=${VITALS_PG_READER_USER:-vitals_reader}
PG_READER_PASSWORD=${VITALS_PG_READER_PASSWORD:-vitals_reader}
DEADLINE_SECS=${VITALS_STACK_DEADLINE:-120}
AM_BIN=/usr/bin/prometheus-alertmanager
AM_PORT=${VITALS_AM_PORT:-9095}

say() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # wait_for <what> <deadline-secs> <command...>
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@"; do
    if (( SECONDS >= end )); then return 1; fi
    sleep 0.5
  done
  say "$what ready"
}

kafka_classpath() { printf '%s' "$CACHE/lib/*"; }

kafka_resolve() {
  # The cache is valid for the pom it was resolved from.
  local want; want=$(sha256sum "$ROOT/scripts/kafka/pom.xml" | cut -d' ' -f1)
  if [[ "$(cat "$CACHE/lib/.complete" 2>/dev/null)" == "$want" ]]; then return; fi
  rm -rf "$CACHE/lib"
  command -v java >/dev/null || die "Java is missing: install a JDK 17+ (Debian: openjdk-17-jre-headless)"
  command -v mvn >/dev/null || die "Maven is missing: install it (Debian: maven)"
  say "resolving the Kafka broker jars with Maven into $CACHE/lib (first run only)"
  mkdir -p "$CACHE"
  if ! mvn -q -B -f "$ROOT/scripts/kafka/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$CACHE/lib" -DincludeScope=runtime >"$CACHE/mvn.log" 2>&1; then
    tail -n 20 "$CACHE/mvn.log" >&2
    die "Maven could not resolve org.apache.kafka:kafka_2.13 (is Maven Central reachable?); log: $CACHE/mvn.log"
  fi
  echo "$want" >"$CACHE/lib/.complete"
}

kafka_pid() { cat "$LOCAL/kafka.pid" 2>/dev/null || true; }
kafka_running() { local p; p=$(kafka_pid); [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }

kafka_ready() {
  java -cp "$(kafka_classpath)" org.apache.kafka.tools.TopicCommand \
    --bootstrap-server "127.0.0.1:$KAFKA_PORT" --list >/dev/null 2>&1
}

kafka_up() {
  if kafka_running && port_open "$KAFKA_PORT"; then say "kafka already running (pid $(kafka_pid))"; return; fi
  port_open "$KAFKA_PORT" && die "port $KAFKA_PORT is taken by another process; set VITALS_KAFKA_PORT"
  port_open "$CTRL_PORT" && die "port $CTRL_PORT is taken by another process; set VITALS_KAFKA_CONTROLLER_PORT"
  kafka_resolve
  local dir="$LOCAL/kafka" conf="$LOCAL/kafka/server.properties"
  mkdir -p "$dir/data"
  cat >"$conf" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CTRL_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$CTRL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=168
CONF
  if [[ ! -f "$dir/data/meta.properties" ]]; then
    local cid
    cid=$(java -cp "$(kafka_classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)
    [[ -n "$cid" ]] || die "kafka StorageTool random-uuid failed"
    java -cp "$(kafka_classpath)" kafka.tools.StorageTool format -t "$cid" -c "$conf" >"$dir/format.log" 2>&1 \
      || { cat "$dir/format.log" >&2; die "formatting Kafka storage failed"; }
  fi
  say "starting kafka on 127.0.0.1:$KAFKA_PORT"
  nohup java -Xms256m -Xmx1g -XX:+UseG1GC -Dlog4j2.configurationFile="$ROOT/scripts/kafka/log4j2.properties" \
    -cp "$(kafka_classpath)" kafka.Kafka "$conf" \
    >"$dir/broker.log" 2>&1 </dev/null &
  echo $! >"$LOCAL/kafka.pid"
  if ! wait_for "kafka" "$DEADLINE_SECS" kafka_ready; then
    tail -n 30 "$dir/broker.log" >&2
    die "kafka did not become ready within ${DEADLINE_SECS}s; log: $dir/broker.log"
  fi
}

kafka_down() {
  if kafka_running; then
    local p; p=$(kafka_pid)
    say "stopping kafka (pid $p)"
    kill "$p" 2>/dev/null || true
    local end=$((SECONDS + 60))
    while kill -0 "$p" 2>/dev/null && (( SECONDS < end )); do sleep 0.5; done
    kill -9 "$p" 2>/dev/null || true
  fi
  rm -f "$LOCAL/kafka.pid"
}

as_pg() { runuser -u postgres -- "$@"; }

# Where the cluster lives: the recorded place, else .local/pg if the postgres user can reach it,
# else a folder of the postgres user's own.
pg_data_dir() {
  if [[ -f "$LOCAL/pg-location" ]]; then cat "$LOCAL/pg-location"; return; fi
  local here="$LOCAL/pg"
  mkdir -p "$here"
  chown postgres:postgres "$here"
  chmod o+x "$LOCAL" "$ROOT" 2>/dev/null || true
  if as_pg test -w "$here" 2>/dev/null; then
    echo "$here"
    return
  fi
  rmdir "$here" 2>/dev/null || true
  local hash
  hash=$(printf '%s' "$ROOT" | md5sum | cut -c1-12)
  local there="/var/lib/postgresql/vitals-$hash"
  say "the postgres user cannot reach $here (a parent folder is not traversable by other users);"
  say "placing the cluster in $there instead (recorded in $LOCAL/pg-location)"
  mkdir -p "$there"
  chown postgres:postgres "$there"
  echo "$there" >"$LOCAL/pg-location"
  echo "$there"
}
pg_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }

pg_up() {
  [[ -x "$PG_BIN/postgres" ]] || die "PostgreSQL $PG_VERSION is not installed (Debian: postgresql-$PG_VERSION)"
  if ! pg_ready; then
    if port_open "$PG_PORT"; then die "port $PG_PORT is taken by something that is not PostgreSQL; set VITALS_PG_PORT"; fi
    # The server refuses to run as root, so the cluster belongs to the postgres user, in a folder
    # that user can reach.
    PG_DATA=$(pg_data_dir)
    mkdir -p "$PG_DATA"
    chown postgres:postgres "$PG_DATA"
    chmod 700 "$PG_DATA"
    if [[ ! -f "$PG_DATA/PG_VERSION" ]]; then
      say "initialising a PostgreSQL cluster in $PG_DATA"
      as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 >"$LOCAL/pg-initdb.log" 2>&1 || { cat "$LOCAL/pg-initdb.log" >&2; die "initdb failed"; }
    fi
    say "starting postgres on 127.0.0.1:$PG_PORT"
    # Statement statistics for the benchmarks, where the server has the module (contrib).
    local stats=""
    if [[ -f "$("$PG_BIN/pg_config" --pkglibdir 2>/dev/null || echo "$PG_BIN/../lib")/pg_stat_statements.so" ]]; then
      stats="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
    fi
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t "$DEADLINE_SECS" \
      -o "-h 127.0.0.1 -p $PG_PORT -k /tmp -c max_connections=300 -c shared_buffers=512MB -c fsync=on $stats" start >/dev/null \
      || { tail -n 20 "$PG_DATA/server.log" >&2; die "postgres did not start; log: $PG_DATA/server.log"; }
    wait_for "postgres" "$DEADLINE_SECS" pg_ready || die "postgres not ready within ${DEADLINE_SECS}s"
  else
    say "postgres already running on port $PG_PORT"
  fi
  local psql=("$PG_BIN/psql" -h /tmp -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -qtA)
  if [[ "$(as_pg "${psql[@]}" -c "select 1 from pg_roles where rolname='$PG_USER'")" != 1 ]]; then
    as_pg "${psql[@]}" -c "create role $PG_USER login createdb password '$PG_PASSWORD'"
  fi
  if [[ "$(as_pg "${psql[@]}" -c "select 1 from pg_database where datname='$PG_DB'")" != 1 ]]; then
    as_pg "${psql[@]}" -c "create database $PG_DB owner $PG_USER"
  fi
  # The read-only role of the API: it may read every schema and table the owner creates.
  if [[ "$(as_pg "${psql[@]}" -c "select 1 from pg_roles where rolname='$PG_READER'")" != 1 ]]; then
    as_pg "${psql[@]}" -c "create role $PG_READER login password '$PG_READER_PASSWORD'"
  fi
  # Statement statistics for the benchmarks (e2e-bench prints each write statement's share); a
  # cluster started before they were configured goes on without them.
  if [[ "$(as_pg "${psql[@]}" -c "show shared_preload_libraries")" == *pg_stat_statements* ]]; then
    as_pg "${psql[@]}" -d "$PG_DB" <<SQL >/dev/null
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
GRANT pg_read_all_stats TO $PG_USER;
GRANT EXECUTE ON FUNCTION pg_stat_statements_reset(oid, oid, bigint) TO $PG_USER;
SQL
  fi
  as_pg "${psql[@]}" -d "$PG_DB" <<SQL >/dev/null
ALTER DEFAULT PRIVILEGES FOR ROLE $PG_USER GRANT USAGE ON SCHEMAS TO $PG_READER;
ALTER DEFAULT PRIVILEGES FOR ROLE $PG_USER GRANT SELECT ON TABLES TO $PG_READER;
DO \$\$
DECLARE s text;
BEGIN
  FOR s IN SELECT nspname FROM pg_namespace WHERE nspowner = '$PG_USER'::regrole LOOP
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO $PG_READER', s);
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO $PG_READER', s);
  END LOOP;
END
\$\$;
SQL
}

pg_down() {
  PG_DATA=$(pg_data_dir)
  if [[ -f "$PG_DATA/postmaster.pid" ]]; then
    say "stopping postgres"
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null || true
  fi
}

# Alertmanager on loopback only, without clustering (no gossip port), its data in STORAGE.
am_args() { # am_args CONFIG PORT STORAGE
  printf '%s\n' "--config.file=$1" "--storage.path=$3" "--web.listen-address=127.0.0.1:$2" "--cluster.listen-address="
}

am_pid() { cat "$LOCAL/alertmanager.pid" 2>/dev/null || true; }
am_running() { local p; p=$(am_pid); [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }

am_up() {
  [[ -x "$AM_BIN" ]] || die "$AM_BIN is missing (scripts/install-deps.sh installs prometheus-alertmanager)"
  if am_running; then say "alertmanager already running (pid $(am_pid))"; return; fi
  mkdir -p "$LOCAL/alertmanager"
  local args; mapfile -t args < <(am_args "$ROOT/deploy/alertmanager/alertmanager.yml" "$AM_PORT" "$LOCAL/alertmanager")
  say "starting alertmanager on 127.0.0.1:$AM_PORT"
  nohup "$AM_BIN" "${args[@]}" >"$LOCAL/alertmanager.log" 2>&1 &
  echo $! >"$LOCAL/alertmanager.pid"
  wait_for "alertmanager" "$DEADLINE_SECS" curl -fsS "http://127.0.0.1:$AM_PORT/-/ready" -o /dev/null
  say "alertmanager ready: http://127.0.0.1:$AM_PORT (log: .local/alertmanager.log)"
}

am_down() {
  if am_running; then
    say "stopping alertmanager"
    kill "$(am_pid)" 2>/dev/null || true
  fi
  rm -f "$LOCAL/alertmanager.pid"
}

case "${1:-}" in
  up)
    mkdir -p "$LOCAL"
    pg_up
    kafka_up
    say "up: kafka=127.0.0.1:$KAFKA_PORT postgres=postgres://$PG_USER@127.0.0.1:$PG_PORT/$PG_DB"
    ;;
  down) am_down; kafka_down; pg_down ;;
  am-up) mkdir -p "$LOCAL"; am_up ;;
  am-down) am_down ;;
  am-run)
    [[ $# -eq 4 ]] || die "usage: $0 am-run CONFIG PORT STORAGE"
    [[ -x "$AM_BIN" ]] || die "$AM_BIN is missing (scripts/install-deps.sh installs prometheus-alertmanager)"
    mapfile -t args < <(am_args "$2" "$3" "$4")
    exec "$AM_BIN" "${args[@]}"
    ;;
  kafka-up) mkdir -p "$LOCAL"; kafka_up ;;
  kafka-down) kafka_down ;;
  pg-up) mkdir -p "$LOCAL"; pg_up ;;
  pg-down) pg_down ;;
  status)
    if kafka_running; then echo "kafka: running (pid $(kafka_pid))"; else echo "kafka: stopped"; fi
    if pg_ready; then echo "postgres: running"; else echo "postgres: stopped"; fi
    if am_running; then echo "alertmanager: running (pid $(am_pid))"; else echo "alertmanager: stopped"; fi
    ;;
  *) echo "usage: $0 up|down|status|kafka-up|kafka-down|pg-up|pg-down|am-up|am-down|am-run CONFIG PORT STORAGE" >&2; exit 2 ;;
esac
