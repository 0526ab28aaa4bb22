#!/usr/bin/env bash
# Checks that every dependency a workspace package declares is used: its
# crate name (a `-` read as `_`) appears as a path (`name::`, `use name`,
# `extern crate name`) in the package's sources. [dependencies] are looked
# for in src/ (and build.rs), dev-dependencies in src/, tests/, benches/
# and examples/ as well. Prints each unused one and exits 1 on any; 0 and
# one line when every dependency is used.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo metadata --format-version 1 --no-deps | python3 -c '
import json, os, re, sys

def sources(package_dir, folders):
    text = []
    for folder in folders:
        top = os.path.join(package_dir, folder)
        if os.path.isfile(top):
            text.append(open(top, encoding="utf-8").read())
        for here, dirs, files in os.walk(top):
            # a nested package is its own: it has a Cargo.toml of its own
            dirs[:] = [d for d in dirs
                       if not os.path.exists(os.path.join(here, d, "Cargo.toml"))]
            text += [open(os.path.join(here, f), encoding="utf-8").read()
                     for f in files if f.endswith(".rs")]
    return "\n".join(text)

problems = []
checked = 0
for package in json.load(sys.stdin)["packages"]:
    package_dir = os.path.dirname(package["manifest_path"])
    code = {
        None: sources(package_dir, ["src", "build.rs"]),
        "dev": sources(package_dir, ["src", "build.rs", "tests", "benches", "examples"]),
    }
    for dep in package["dependencies"]:
        if dep["kind"] not in code:
            continue
        crate = (dep.get("rename") or dep["name"]).replace("-", "_")
        used = re.search(rf"(?<![\w:]){crate}::|\buse {crate}\b|\bextern crate {crate}\b",
                         code[dep["kind"]])
        checked += 1
        if not used:
            kind = "dev-dependency" if dep["kind"] == "dev" else "dependency"
            owner, name = package["name"], dep["name"]
            problems.append(f"{owner}: the {kind} {name} is not used in its sources")
for problem in problems:
    print("check-deps:", problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-deps: all {checked} dependencies of the workspace are used")
'
