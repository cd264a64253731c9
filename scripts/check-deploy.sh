#!/usr/bin/env bash
# The deployment artefacts, checked as Docker and Kubernetes would take them (this machine runs
# neither): the Dockerfile (hadolint, then its build and runtime stages by scripts/check-image.py)
# and the Helm chart deploy/helm/vitals (helm lint; every rendered object decoded strictly into
# the Kubernetes API types by tools/k8s-check, with every flag and variable held against the
# binaries' --help). Run by the test command after the build (it needs target/release); alone:
# `scripts/check-deploy.sh`. Helm and hadolint come from scripts/install-deps.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
helm=${VITALS_HELM:-/opt/vitals-helm/bin/helm}
go=$(command -v go || echo /usr/local/go/bin/go)
chart=deploy/helm/vitals
bin_dir=${CARGO_TARGET_DIR:-$ROOT/target}/release
status=0
say() { echo "[deploy] $*" >&2; }

say "hadolint Dockerfile"
hadolint Dockerfile || status=1
python3 scripts/check-image.py || status=1
# Dockerfiles the image check must refuse, one fault each (on the binaries just built).
broken=$(mktemp -d)
image_refuses() {
  local want=$1 from=$2 to=$3 file=${4:-Dockerfile}
  cp Dockerfile .dockerignore "$broken/"
  python3 - "$broken/$file" "$from" "$to" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
assert old in text, f"{old!r} is not in {path}"
open(path, "w").write(text.replace(old, new, 1))
PY
  if out=$(python3 scripts/check-image.py --no-build --dockerfile "$broken/Dockerfile" --dockerignore "$broken/.dockerignore" 2>&1); then
    say "image check accepted a Dockerfile that $want"; status=1
  elif ! grep -qF "PROBLEM" <<<"$out"; then
    say "image check failed without naming the problem ($want): $out"; status=1
  fi
}
image_refuses "runs as root" "USER 10001:10001
ENTRYPOINT [\"/usr/local/bin/vitals-processor\"]" "USER root
ENTRYPOINT [\"/usr/local/bin/vitals-processor\"]"
image_refuses "has a shell-form entrypoint" 'ENTRYPOINT ["/usr/local/bin/vitals-processor"]' 'ENTRYPOINT /usr/local/bin/vitals-processor'
image_refuses "copies a binary it does not build" " -p vitals-merger" ""
image_refuses "lacks OpenSSL at run time" "ca-certificates libssl3" "tzdata"
image_refuses "builds on too old a Rust" "rust:1.95-bookworm" "rust:1.60-bookworm"
image_refuses "leaves the migrations out of the build" "target
" "target
migrations
" .dockerignore

say "the rules the chart's PrometheusRule carries are deploy/prometheus/vitals-rules.yml"
cmp deploy/prometheus/vitals-rules.yml "$chart/files/vitals-rules.yml" || status=1

say "tools/k8s-check: its own tests, then the build"
checker=$(mktemp -d)/k8s-check
(cd tools/k8s-check && "$go" test ./... && "$go" build -o "$checker" .) || exit 1

render=$(mktemp -d)
for values in default "$chart"/ci/*.yaml; do
  name=$(basename "$values" .yaml)
  args=()
  [[ $values == default ]] || args=(-f "$values")
  say "values $name: helm lint --strict, helm template, k8s-check"
  "$helm" lint --strict "$chart" "${args[@]}" >/dev/null || { "$helm" lint --strict "$chart" "${args[@]}"; status=1; continue; }
  "$helm" template vitals "$chart" --namespace vitals "${args[@]}" > "$render/$name.yaml" || { status=1; continue; }
  if ! "$checker" -bin-dir "$bin_dir" < "$render/$name.yaml" > "$render/$name.check"; then
    grep PROBLEM "$render/$name.check" >&2; status=1
  fi
  tail -n 1 "$render/$name.check" >&2
done

# Values the schema or the templates must refuse, each with the message an operator would read.
refuse() {
  local want=$1; shift
  if out=$("$helm" template vitals "$chart" "$@" 2>&1); then
    say "accepted, should refuse ($want): $*"; status=1
  elif ! grep -qF -- "$want" <<<"$out"; then
    say "refused without saying '$want': $* -> $out"; status=1
  fi
}
refuse "minimum: got 0, want 1" --set processor.lanes=0
refuse "additional properties 'lanse' not allowed" --set processor.lanse=2
refuse "alertmanagerUrls" --set alerter.enabled=true
refuse "must set listen" --set router.enabled=true --set-string router.routes='listen = "127.0.0.1:8088"'
refuse "merger" --set otlp.enabled=true --set otlp.toMerger=true --set otlp.tokensSecret.secretName=t
refuse "otlp.tokensSecret.secretName" --set otlp.enabled=true
refuse "does not match pattern" --set-json 'kafka.options=["security.protocol=SSL,sasl.mechanism=PLAIN"]'

# The pods themselves, started as a kubelet would on the test stack (the test command gives it).
if [[ -n ${VITALS_TEST_KAFKA:-} && -n ${VITALS_TEST_DATABASE_URL:-} && -n ${VITALS_TEST_READER_DATABASE_URL:-} ]]; then
  say "the chart's workloads started on the local stack (scripts/check-chart-start.py)"
  python3 scripts/check-chart-start.py || status=1
else
  say "no test stack given (VITALS_TEST_KAFKA, VITALS_TEST_*DATABASE_URL): the chart's workloads are not started"
fi

if ((status)); then say "FAILED"; else say "the image and the chart check out"; fi
exit $status
