#!/usr/bin/env bash
# The demo: one command that shows vitals working, on a fresh machine.
#
#   scripts/demo.sh            # about four minutes
#   scripts/demo.sh --check    # the same, exiting 1 if a fault is missed or does not heal (CI)
#   scripts/demo.sh --gateway litellm   # LiteLLM's proxy in front instead of vitals' router
#                                        # (deploy/litellm/demo.yaml, vitals-litellm reporting and routing)
#   scripts/demo.sh --gateway haproxy   # HAProxy in front (deploy/haproxy/demo*.cfg): its access log
#                                        # feeds vitals through vitals-logbridge, vitals-haproxy steers it
#
# It brings up the local stack (Kafka + Postgres), builds and starts the processor, the API, the
# upstream simulator (deploy/demo/sim.toml: pools "chat" and "batch"), the prober
# (deploy/demo/targets.toml) and the router (deploy/demo/routes.toml), then runs vitals-demo:
# load through the router, the fault timeline of deploy/demo/timeline.toml on the simulator,
# every transition printed as it happens, and a summary table per fault. The services stop at
# the end (Ctrl-C stops everything early); the stack keeps running (scripts/stack.sh down).
# Logs: target/demo/*.log.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
say() { echo "[demo] $*" >&2; }

gateway=router
demo_args=()
while (($#)); do
  case $1 in
    --gateway) gateway=${2:-}; shift 2 || { say "--gateway needs router, litellm or haproxy"; exit 2; } ;;
    --gateway=*) gateway=${1#--gateway=}; shift ;;
    *) demo_args+=("$1"); shift ;;
  esac
done
case $gateway in
  router|litellm|haproxy) ;;
  *) say "--gateway must be router, litellm or haproxy, not '$gateway'"; exit 2 ;;
esac

# Every port the demo listens on must be free: an earlier demo or scripts/run.sh would answer
# in its place.
for port in 8080 8090 8091 9310 9311 9312 9313 9314 9321 9322 9464 9465 9466 9467; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    say "port $port is in use (is scripts/run.sh or another demo running?); stop it first"
    exit 1
  fi
done

scripts/install-deps.sh demo "$gateway"
scripts/stack.sh up
export VITALS_KAFKA_BROKERS=${VITALS_KAFKA_BROKERS:-127.0.0.1:${VITALS_KAFKA_PORT:-9092}}
export VITALS_DATABASE_URL=${VITALS_DATABASE_URL:-postgres://${VITALS_PG_USER:-vitals}:${VITALS_PG_PASSWORD:-vitals}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
reader_url=${VITALS_API_DATABASE_URL:-postgres://${VITALS_PG_READER_USER:-vitals_reader}:${VITALS_PG_READER_PASSWORD:-vitals_reader}@127.0.0.1:${VITALS_PG_PORT:-5432}/${VITALS_PG_DB:-vitals}}
bins=(vitals-processor vitals-api vitals-prober vitals-router vitals-upstream-sim vitals-demo vitals-logbridge vitals-haproxy)
if [[ "${VITALS_DEMO_PREBUILT:-}" == 1 ]]; then
  # CI: the test command has just built every binary (one cargo invocation, one feature set).
  for b in "${bins[@]}"; do [[ -x target/release/$b ]] || { say "target/release/$b is missing"; exit 1; }; done
else
  say "building (release; the first build takes several minutes)"
  pkgs=()
  for b in "${bins[@]}"; do pkgs+=(-p "$b"); done
  cargo build --release -q "${pkgs[@]}"
fi

logs=target/demo
mkdir -p "$logs"
pids=()
cleanup() {
  ((${#pids[@]})) && kill -TERM "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME COMMAND...: in the background, its output in target/demo/NAME.log.
start() {
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1 &
  pids+=("$!")
}

# ready NAME URL: wait (up to 60 s) until URL answers 2xx; show the log if the service died.
ready() {
  local name=$1 url=$2 pid=${pids[-1]}
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$url" 2>/dev/null && { say "$name is up ($url)"; return; }
    if ! kill -0 "$pid" 2>/dev/null; then
      say "$name exited; the end of $logs/$name.log:"
      tail -n 20 "$logs/$name.log" >&2
      exit 1
    fi
    sleep 0.2
  done
  say "$name did not come up within 60 s (see $logs/$name.log)"
  exit 1
}

start processor target/release/vitals-processor
ready processor http://127.0.0.1:9464/readyz
start api target/release/vitals-api --database-url "$reader_url"
ready api http://127.0.0.1:8080/readyz
start upstream-sim target/release/vitals-upstream-sim --config deploy/demo/sim.toml
ready upstream-sim http://127.0.0.1:9310/endpoints
start prober target/release/vitals-prober --config deploy/demo/targets.toml --name demo-prober
ready prober http://127.0.0.1:9465/readyz
routes=deploy/demo/routes.toml
timeline=deploy/demo/timeline.toml
if [[ $gateway == haproxy ]]; then
  # HAProxy's access log → vitals-logbridge → vitals; vitals' decisions → vitals-haproxy → HAProxy.
  start logbridge target/release/vitals-logbridge --unix target/demo/haproxy-log.sock \
    --unix-mode 600 --map deploy/haproxy/demo-map.toml
  ready logbridge http://127.0.0.1:9466/readyz
  start haproxy haproxy -db -f deploy/haproxy/demo-global.cfg -f deploy/haproxy/vitals.cfg -f deploy/haproxy/demo.cfg
  for _ in $(seq 1 100); do
    [[ -S target/demo/haproxy-admin.sock ]] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { say "haproxy exited; see $logs/haproxy.log"; tail -n 5 "$logs/haproxy.log" >&2; exit 1; }
    sleep 0.1
  done
  start steer target/release/vitals-haproxy --runtime-api target/demo/haproxy-admin.sock \
    --map deploy/haproxy/demo-map.toml --state-file target/demo/haproxy-steered
  ready vitals-haproxy http://127.0.0.1:9467/readyz
  timeline=deploy/haproxy/demo-timeline.toml
elif [[ $gateway == litellm ]]; then
  # LiteLLM's proxy from its virtual environment (scripts/install-deps.sh), with vitals-litellm.
  venv=${VITALS_LITELLM_VENV:-/opt/vitals-litellm-venv}
  export LITELLM_MASTER_KEY=${LITELLM_MASTER_KEY:-sk-vitals-demo-$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')}
  export VITALS_DEMO_ROUTER_KEY=$LITELLM_MASTER_KEY
  start litellm env LITELLM_LOCAL_MODEL_COST_MAP=True VITALS_GATEWAY=demo-litellm \
    "$venv/bin/litellm" --config deploy/litellm/demo.yaml --host 127.0.0.1 --port 8090
  ready litellm http://127.0.0.1:8090/health/liveliness
  routes=deploy/litellm/demo-routes.toml
  # A Python proxy sharing two cores with the whole stack: a lighter load, so that the first
  # tokens the demo's users see are the upstreams', not the proxy's queue.
  demo_args=(--rate 4 ${demo_args[@]+"${demo_args[@]}"})
elif [[ $gateway == router ]]; then
  start router target/release/vitals-router --config deploy/demo/routes.toml
  ready router http://127.0.0.1:8090/healthz
fi
if [[ $gateway != haproxy ]]; then
  # A second gateway in front of the chat pool (its own name, its own route to chat-a): the
  # timeline's "one gateway's route broken" must take chat-a from it alone.
  start router-2 target/release/vitals-router --config deploy/demo/routes-2.toml
  ready router-2 http://127.0.0.1:8091/healthz
  demo_args=(--second-router http://127.0.0.1:8091 ${demo_args[@]+"${demo_args[@]}"})
fi

say "the services run; logs in $logs/. Playing the timeline of $timeline through the $gateway"
target/release/vitals-demo --routes "$routes" --timeline "$timeline" \
  --api http://127.0.0.1:8080 --router http://127.0.0.1:8090 --sim-admin http://127.0.0.1:9310 ${demo_args[@]+"${demo_args[@]}"}
