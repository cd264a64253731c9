#!/usr/bin/env python3
"""Dependency hygiene, in the manner of cargo-machete: every dependency a package declares is
named in its code, and every one comes from the workspace table (one version of each crate,
declared in one place); and the layers of docs/architecture.md hold: a library never depends on a
binary or a dev tool, no binary on another, testkit only in tests, and the packages that only
read (the store, the API) never link the engine. Exits non-zero and names each offender.

A dependency counts as used when its crate name (dashes as underscores) appears as a word in
the package's sources (src/, tests/, benches/, examples/, build.rs); one used only through a
derive or a macro would be listed in IMPLICIT with the reason."""

import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Dependencies used without their name in the code, per package, with the reason (none today).
IMPLICIT: dict[str, tuple[str, ...]] = {}
# Packages that must not reach the engine through their normal dependencies, with the reason.
NO_ENGINE = {
    "vitals-store": "the store writes and reads rows; the processor restores engines",
    "vitals-api": "the API only reads the audit log and hands operator actions to Kafka",
}

def sources(pkg: pathlib.Path) -> str:
    text = []
    for sub in ("src", "tests", "benches", "examples"):
        for f in (pkg / sub).rglob("*.rs"):
            text.append(f.read_text())
    build = pkg / "build.rs"
    if build.exists():
        text.append(build.read_text())
    return "\n".join(text)

def main() -> int:
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())
    members = workspace["workspace"]["members"]
    problems = []
    for m in members:
        pkg = ROOT / m
        manifest = tomllib.loads((pkg / "Cargo.toml").read_text())
        code = sources(pkg)
        for table in ("dependencies", "dev-dependencies", "build-dependencies"):
            for name, spec in manifest.get(table, {}).items():
                if not (isinstance(spec, dict) and spec.get("workspace") is True):
                    problems.append(f"{m}: [{table}] {name} does not come from the workspace table")
                ident = name.replace("-", "_")
                if name in IMPLICIT.get(m, ()):
                    continue
                if not re.search(rf"\b{re.escape(ident)}\b", code):
                    problems.append(f"{m}: [{table}] {name} is declared but not used")
    declared = set(workspace["workspace"].get("dependencies", {}))
    used = set()
    for m in members:
        manifest = tomllib.loads((ROOT / m / "Cargo.toml").read_text())
        for table in ("dependencies", "dev-dependencies", "build-dependencies"):
            used |= set(manifest.get(table, {}))
    for name in sorted(declared - used):
        problems.append(f"Cargo.toml: workspace dependency {name} is used by no package")
    problems += layers(members)
    for p in problems:
        print(p)
    print(f"check-deps: {len(members)} packages, {len(problems)} problems")
    return 1 if problems else 0

def layers(members: list[str]) -> list[str]:
    """The layer rules, over the vitals packages' normal dependencies."""
    where: dict[str, str] = {}
    deps: dict[str, set[str]] = {}
    dev: dict[str, set[str]] = {}
    for m in members:
        manifest = tomllib.loads((ROOT / m / "Cargo.toml").read_text())
        name = manifest["package"]["name"]
        where[name] = m
        deps[name] = set(manifest.get("dependencies", {}))
        dev[name] = set(manifest.get("dev-dependencies", {}))
    problems = []
    for name, ds in deps.items():
        top = where[name].split("/")[0]
        for d in sorted(ds & set(where)):
            dtop = where[d].split("/")[0]
            if top == "crates" and dtop != "crates":
                problems.append(f"{where[name]}: the library {name} depends on {where[d]}")
            if top == "services" and dtop == "services":
                problems.append(f"{where[name]}: the binary {name} depends on the binary {d}")
            if d == "vitals-testkit" and top not in ("tools", "tests"):
                problems.append(f"{where[name]}: vitals-testkit is for tests (a dev-dependency)")
    for name, why in NO_ENGINE.items():
        seen, todo = set(), [name]
        while todo:
            for d in deps.get(todo.pop(), set()) & set(where):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        if "vitals-engine" in seen:
            problems.append(f"{where[name]}: {name} links vitals-engine ({why})")
    return problems

if __name__ == "__main__":
    sys.exit(main())
