#!/usr/bin/env bash
# Checks the crate graph against the layer table of docs/design.md ("The
# crates"): every workspace package has a row, its path dependencies and
# dev-dependencies are the ones the row names, and each dependency leads to
# a lower layer (the test kit is outside the layers). Prints each
# difference and exits 1 on any; 0 and one line when they agree.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo metadata --format-version 1 --no-deps | python3 -c '
import json, re, sys

HEADER = "| package | directory | layer | depends on | dev-depends on |"
lines = open("docs/design.md", encoding="utf-8").read().splitlines()
if HEADER not in lines:
    sys.exit("docs/design.md: no layer table (a table headed " + HEADER + ")")
rows = {}
for line in lines[lines.index(HEADER) + 2:]:
    if not line.startswith("|"):
        break
    cells = [c.strip() for c in line.strip("|").split("|")]
    names = lambda cell: set(re.findall(r"`([^`]+)`", cell))
    package = names(cells[0]).pop()
    rows[package] = (cells[2], names(cells[3]), names(cells[4]))

metadata = json.load(sys.stdin)
problems = []
for package in metadata["packages"]:
    name = package["name"]
    deps = lambda kind: {d["name"] for d in package["dependencies"]
                         if d.get("path") and d["kind"] == kind}
    if name not in rows:
        problems.append(f"{name}: no row in the layer table of docs/design.md")
        continue
    layer, normal, dev = rows[name]
    for kind, listed, actual in (("depends on", normal, deps(None)),
                                 ("dev-depends on", dev, deps("dev"))):
        for extra in sorted(actual - listed):
            problems.append(f"{name} {kind} {extra}: its Cargo.toml names it, the table does not")
        for missing in sorted(listed - actual):
            problems.append(f"{name} {kind} {missing}: the table names it, its Cargo.toml does not")
    for dep in sorted(deps(None)):
        if dep in rows and layer.isdigit() and rows[dep][0].isdigit() \
                and int(rows[dep][0]) >= int(layer):
            problems.append(f"{name} (layer {layer}) depends on {dep} (layer {rows[dep][0]}): a dependency leads to a lower layer")
for stale in sorted(set(rows) - {p["name"] for p in metadata["packages"]}):
    problems.append(f"{stale}: a row in the layer table, but no such package")
for problem in problems:
    print("check-layers:", problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-layers: {len(rows)} packages match the layer table of docs/design.md")
'
