#!/usr/bin/env bash
# The quick loop a contributor runs every minute: every test that needs neither the local stack
# (Kafka, Postgres) nor the programs scripts/install-deps.sh installs beyond python3's fastavro —
# the unit tests of every package, and each integration test file that does not use
# vitals-testkit (the engine's scenarios and properties, the scorecard's targets, the codec, the
# parsers, the prober's probes and schedule...). `scripts/test.sh` stays the whole suite, and
# what CI runs. Arguments go to every `cargo test` (e.g. a name filter).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo test --release --workspace --lib --bins "$@"
for dir in crates/* services/* tools/*; do
  [[ -d $dir/tests ]] || continue
  pkg=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$dir/Cargo.toml" | head -1)
  tests=()
  for f in "$dir"/tests/*.rs; do
    grep -q 'vitals_testkit\|VITALS_TEST_' "$f" && continue
    # A test file whose shared helpers (tests/<name>/) start the stack needs it too.
    helpers=$(sed -n 's/^mod \([a-z_]*\);$/\1/p' "$f")
    for h in $helpers; do
      grep -rqs 'vitals_testkit\|VITALS_TEST_' "$dir/tests/$h" "$dir/tests/$h.rs" && continue 2
    done
    tests+=(--test "$(basename "$f" .rs)")
  done
  if ((${#tests[@]})); then
    echo "[quick-test] $pkg: ${tests[*]}" >&2
    cargo test --release -p "$pkg" "${tests[@]}" "$@"
  fi
done
