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

# The wings of lmcache-launcher against the wing table of docs/design.md:
# outside unit tests (a #[cfg(test)] module) and comments, a file of a wing
# names (crate::<wing>, or super:: back to the crate's root, or a name the
# root re-exports from a wing) only the wings its row lists.
python3 - <<'PY'
import os, re, sys

HEADER = "| wing | path | may use |"
lines = open("docs/design.md", encoding="utf-8").read().splitlines()
if HEADER not in lines:
    sys.exit("docs/design.md: no wing table (a table headed " + HEADER + ")")
rows = {}
for line in lines[lines.index(HEADER) + 2:]:
    if not line.startswith("|"):
        break
    cells = [c.strip() for c in line.strip("|").split("|")]
    wing = re.findall(r"`([^`]+)`", cells[0])[0]
    path = re.findall(r"`([^`]+)`", cells[1])[0]
    rows[wing] = (path, set(re.findall(r"`([^`]+)`", cells[2])))

src = "launcher/src"
lib = open(f"{src}/lib.rs", encoding="utf-8").read()
# The root's re-exports: each name, the wing it comes from.
root_names = {}
for m in re.finditer(r"pub use (\w+)::([^;]+);", lib):
    for name in re.findall(r"\w+", m.group(2).split("::")[-1] if "{" not in m.group(2) else m.group(2).split("{", 1)[1]):
        root_names[name] = m.group(1)
declared = set(re.findall(r"(?m)^pub mod (\w+);", lib))

def wing_of(rel):
    for wing, (path, _) in rows.items():
        if rel == path or (path.endswith("/") and rel.startswith(path)):
            return wing
    return None

def test_files():
    """Files that are whole #[cfg(test)] modules."""
    found = set()
    for folder, _, files in os.walk(src):
        for f in files:
            text = open(os.path.join(folder, f), encoding="utf-8").read()
            for name in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod (\w+);", text):
                base = folder if f in ("mod.rs", "lib.rs") else os.path.join(folder, f[:-3])
                found.update({os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")})
    return found

problems = []
for wing in declared | {"exit", "output", "process"}:
    if wing not in rows:
        problems.append(f"launcher/src/{wing}: a wing with no row in the wing table of docs/design.md")
skip = test_files()
for folder, _, files in os.walk(src):
    for f in sorted(files):
        path = os.path.join(folder, f)
        if not f.endswith(".rs") or path == f"{src}/lib.rs" or path in skip:
            continue
        wing = wing_of(path)
        if wing is None:
            problems.append(f"{path}: in no wing of the wing table of docs/design.md")
            continue
        text = open(path, encoding="utf-8").read()
        tests = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\(\w+\))?\s+)?mod\s+\w+\s*\{", text)
        text = text[: tests.start()] if tests else text
        code = "\n".join(re.sub(r"(^|\s)//.*$", "", l) for l in text.splitlines())
        # A super:: chain as long as the file's depth below src/ reaches
        # the crate's root, as crate:: does.
        parts = os.path.relpath(path, src)[:-3].split("/")
        depth = len(parts) - (1 if parts[-1] == "mod" else 0)
        root = r"(?:crate|" + "::".join(["super"] * depth) + r")"
        named = set()
        for m in re.finditer(r"(?<![\w:])" + root + r"::(\w+)", code):
            named.add(m.group(1))
        for m in re.finditer(r"(?<![\w:])" + root + r"::\{([^}]*)\}", code):
            named.update(re.findall(r"\w+", m.group(1)))
        for name in sorted(named):
            target = name if name in rows else root_names.get(name)
            if target and target != wing and target not in rows[wing][1]:
                problems.append(f"{path} (wing {wing}) names {name} of the crate root (wing {target}), which its row does not list")
for problem in problems:
    print("check-layers:", problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-layers: {len(rows)} wings of lmcache-launcher match the wing table of docs/design.md")
PY
