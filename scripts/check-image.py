#!/usr/bin/env python3
"""The container image, checked without a Docker engine (this machine has none).

What `docker build` would do with the Dockerfile, done here the way the image would do it:
- the build stage's Rust image is at least as new as every locked crate needs;
- `.dockerignore` leaves out no file git tracks (so `COPY . .` brings everything cargo reads);
- the build stage's exact `cargo build` line runs in the checkout (WORKDIR /src holds the same
  files), and every binary the runtime stage copies is a binary of a package it builds, and exists;
- every shared library those binaries load comes from a package the runtime image has (its base's
  required packages, or what its `apt-get install` line names, with their dependencies);
- the runtime stages run as a numeric non-root user with exec-form entrypoints (no shell needed),
  and each binary starts (`--help`) as that user.
hadolint lints the file itself (scripts/check-deploy.sh). Exit 1 with every problem listed.
"""
import glob
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
problems = []


def fail(msg):
    problems.append(msg)
    print(f"[image] PROBLEM {msg}", file=sys.stderr)


def note(msg):
    print(f"[image] {msg}", file=sys.stderr)


def instructions(path):
    """(stage, keyword, argument) for each instruction, continuation lines joined."""
    out, stage, buf = [], None, ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, arg = buf.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", arg.strip(), re.I)
            stage = {"image": m.group(1), "name": m.group(2) or f"stage{len(out)}"}
        out.append((stage, keyword, arg.strip()))
        buf = ""
    return out


def version_tuple(text):
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def check_rust_version(build_image):
    m = re.match(r"rust:(\d+\.\d+)", build_image)
    if not m:
        fail(f"the build stage's image {build_image} is not rust:X.Y")
        return
    have = version_tuple(m.group(1))
    lock = open(os.path.join(ROOT, "Cargo.lock"), encoding="utf-8").read()
    need, who = (1, 0), "nothing"
    for name, version in re.findall(r'\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"\nsource = "registry', lock):
        manifests = glob.glob(os.path.expanduser(f"~/.cargo/registry/src/*/{name}-{version}/Cargo.toml"))
        if not manifests:
            continue
        m = re.search(r'^rust-version\s*=\s*"([^"]+)"', open(manifests[0], encoding="utf-8").read(), re.M)
        if m and version_tuple(m.group(1)) > need:
            need, who = version_tuple(m.group(1)), f"{name} {version}"
    ws = re.search(r'^rust-version\s*=\s*"([^"]+)"', open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8").read(), re.M)
    if ws and version_tuple(ws.group(1)) > need:
        need, who = version_tuple(ws.group(1)), "the workspace"
    if have < need:
        fail(f"the build stage's {build_image} is older than Rust {need[0]}.{need[1]}, which {who} needs")
    else:
        note(f"build image {build_image}: newest rust-version needed {need[0]}.{need[1]} ({who})")


def dockerignore_matches(patterns, path):
    import fnmatch
    ignored = False
    for p in patterns:
        negate = p.startswith("!")
        p = p[1:] if negate else p
        p = p.strip("/")
        parts = path.split("/")
        hit = any(fnmatch.fnmatch("/".join(parts[:k]), p) for k in range(1, len(parts) + 1))
        if p.startswith("**/"):
            hit = hit or any(fnmatch.fnmatch(x, p[3:]) for x in parts)
        if hit:
            ignored = not negate
    return ignored


def check_dockerignore(path):
    patterns = [l.strip() for l in open(path, encoding="utf-8") if l.strip() and not l.startswith("#")]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    left_out = [f for f in tracked if dockerignore_matches(patterns, f)]
    if left_out:
        fail(f".dockerignore leaves out {len(left_out)} tracked file(s), e.g. {left_out[:5]}")
    note(f".dockerignore: {len(patterns)} patterns, all {len(tracked)} tracked files copied")


def cargo_bins():
    meta = json.loads(subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout)
    return {t["name"]: p["name"] for p in meta["packages"] for t in p["targets"] if "bin" in t["kind"]}


def runtime_packages(apt_names):
    """The packages an image of debian:*-slim plus `apt_names` holds: the required and essential
    packages and apt (what a minimal Debian root holds), the named ones, and every package these
    depend on."""
    q = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Priority} ${Essential}\n"], capture_output=True, text=True)
    base = {l.split()[0] for l in q.stdout.splitlines() if " required " in l or l.endswith(" yes")}
    roots = sorted(base | {"apt"} | set(apt_names))
    deps = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                           "--no-breaks", "--no-replaces", "--no-enhances", *roots], capture_output=True, text=True)
    if deps.returncode != 0:
        fail(f"apt-cache depends: {deps.stderr.strip()[:300]}")
    have = set(roots) | {l.strip() for l in deps.stdout.splitlines() if l and not l.startswith(" ")}
    return {h.split(":")[0] for h in have}


def check_libraries(binaries, apt_names):
    have = runtime_packages(apt_names)
    missing = {}
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True, text=True).stdout
        for lib in re.findall(r"=> (/\S+)", out):
            owner = subprocess.run(["dpkg", "-S", os.path.realpath(lib)], capture_output=True, text=True)
            if owner.returncode != 0:
                owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
            pkg = owner.stdout.split(":")[0].strip() if owner.returncode == 0 else f"(no package owns {lib})"
            if pkg not in have:
                missing.setdefault(pkg, set()).add(os.path.basename(b))
    for pkg, who in sorted(missing.items()):
        fail(f"{', '.join(sorted(who))} need(s) {pkg}, which the runtime image does not install")
    note(f"shared libraries of {len(binaries)} binaries all come from the runtime's packages")


def main(dockerfile, dockerignore, build):
    steps = instructions(dockerfile)
    stages = []
    for stage, keyword, _ in steps:
        if keyword == "FROM":
            stages.append(stage)
    build = next((s for s in stages if s["name"] == "build"), None)
    if build is None:
        fail("no stage named build")
        return
    check_rust_version(build["image"])
    check_dockerignore(dockerignore)

    bins = cargo_bins()
    build_runs = [a for s, k, a in steps if s is build and k == "RUN" and a.startswith("cargo build")]
    if len(build_runs) != 1:
        fail(f"the build stage has {len(build_runs)} cargo build lines, not one")
        return
    cmd = build_runs[0]
    if "--release" not in cmd or "--locked" not in cmd:
        fail("the build stage's cargo build needs --release and --locked")
    packages = set(re.findall(r"-p\s+(\S+)", cmd))
    if build:
        note(f"running the build stage's line: {cmd}")
        r = subprocess.run(["bash", "-c", cmd], cwd=ROOT)
        if r.returncode != 0:
            fail(f"the build stage's cargo build failed (exit {r.returncode})")
            return

    last = stages[-1]
    copied = []
    for stage, keyword, arg in steps:
        if keyword != "COPY" or "--from=build" not in arg:
            continue
        srcs = shlex.split(arg.replace("--from=build", ""))[:-1]
        for src in srcs:
            rel = os.path.relpath(src, "/src")
            path = os.path.join(ROOT, rel)
            name = os.path.basename(rel)
            if not rel.startswith("target/release/"):
                fail(f"{stage['name']} copies {src}, which is not a release binary")
            elif bins.get(name) not in packages:
                fail(f"{stage['name']} copies {name}, a binary of {bins.get(name)}, which the build line does not build")
            elif not os.access(path, os.X_OK):
                fail(f"{stage['name']} copies {src}, which the build did not make")
            else:
                copied.append(path)
    if not copied:
        fail("the runtime stage copies no binaries")
    check_libraries(copied, apt_installs(steps, last))

    for stage in stages:
        if stage["name"] == "build":
            continue
        users = [a for s, k, a in steps if s is stage and k == "USER"]
        entry = [a for s, k, a in steps if s is stage and k == "ENTRYPOINT"]
        if not users or not re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]):
            fail(f"stage {stage['name']} must end as a numeric non-root USER (has {users[-1:] or 'none'})")
        if not entry or not entry[-1].startswith("["):
            fail(f"stage {stage['name']} needs an exec-form ENTRYPOINT (no shell)")
    user = next((a for s, k, a in reversed(steps) if s is last and k == "USER"), "10001:10001")
    uid, _, gid = user.partition(":")
    # A checkout under a folder others cannot enter (a home of mode 700): start copies instead.
    runnable = copied if all(reachable(b) for b in copied) else copies(copied)
    for b in runnable:
        r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups", b, "--help"],
                           cwd="/", capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        if r.returncode != 0:
            fail(f"{os.path.basename(b)} --help as {user} exited {r.returncode}: {r.stderr.strip()[:200]}")
    note(f"{len(copied)} binaries start as user {user}")


def reachable(path):
    d = os.path.dirname(path)
    while d not in ("/", ""):
        if not os.stat(d).st_mode & 0o001:
            return False
        d = os.path.dirname(d)
    return bool(os.stat(path).st_mode & 0o005)


def copies(paths):
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="vitals-image-")
    os.chmod(d, 0o755)
    return [shutil.copy(p, d) for p in paths]


def apt_installs(steps, stage):
    names = []
    for s, k, a in steps:
        if s is stage and k == "RUN":
            for m in re.finditer(r"apt-get install ([^&;]+)", a):
                names += [w for w in m.group(1).split() if not w.startswith("-")]
    return names


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dockerfile", default=os.path.join(ROOT, "Dockerfile"))
    ap.add_argument("--dockerignore", default=os.path.join(ROOT, ".dockerignore"))
    ap.add_argument("--no-build", action="store_true",
                    help="check against the binaries already built (the negative cases of check-deploy.sh)")
    a = ap.parse_args()
    main(a.dockerfile, a.dockerignore, not a.no_build)
    if problems:
        print(f"[image] {len(problems)} problem(s)", file=sys.stderr)
        sys.exit(1)
    print("[image] the Dockerfile's build and runtime stages check out", file=sys.stderr)
