#!/usr/bin/env bash
# Checks that no two files of a crate import each other, even by a detour
# (docs/design.md, "The crates"): in every crate's sources, outside unit
# tests (a #[cfg(test)] module and what follows it) and comments, each path
# `crate::...`, `super::...` or `self::...` (braced lists included) is an
# arrow from its file to the file of the deepest module it names. Prints
# each circle, its files in order, and exits 1 on any; 0 and one line when
# there is none.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo metadata --format-version 1 --no-deps | python3 -c '
import json, os, re, sys

def modules(src):
    """Module path (a tuple of names) -> its file, for one crate."""
    found = {}
    for folder, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            parts = tuple(os.path.relpath(path, src)[:-3].split("/"))
            if parts in (("lib",), ("main",)):
                parts = ()
            elif parts[-1] == "mod":
                parts = parts[:-1]
            found.setdefault(parts, path)
    return found

def paths(code):
    """Every crate::/super::/self:: path of `code`, braced lists expanded."""
    def expand(path):
        m = re.match(r"(.*?)\{(.*)\}$", path, re.S)
        if not m:
            return [path]
        items, depth, cur = [], 0, ""
        for ch in m.group(2):
            depth += (ch == "{") - (ch == "}")
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items.append(cur)
        return [p for item in items if item.strip() for p in expand(m.group(1) + item.strip())]
    for m in re.finditer(r"\b((?:crate|super|self)(?:::(?:\w+|\{[^;]*?\}))+)", code):
        for path in expand(m.group(1)):
            yield [s for s in re.sub(r"\s", "", path).split("::") if re.fullmatch(r"\w+", s)]

def target(module, segments, files):
    """The deepest module file a path names, from `module`."""
    if segments[0] == "crate":
        base, rest = (), segments[1:]
    else:
        base, rest = module, segments
        while rest and rest[0] in ("super", "self"):
            base = base[:-1] if rest[0] == "super" else base
            rest = rest[1:]
    best = base if base in files else None
    for name in rest:
        base = base + (name,)
        if base not in files:
            break
        best = base
    return best

def circles(files):
    arrows = {}
    for module, path in files.items():
        text = open(path, encoding="utf-8").read().split("#[cfg(test)]", 1)[0]
        code = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        arrows[module] = {t for s in paths(code) if (t := target(module, s, files)) not in (None, module)}
    index, low, stack, on, found = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in arrows[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(files[m] for m in part))
    sys.setrecursionlimit(10000)
    for v in files:
        if v not in index:
            visit(v)
    return found

problems, crates = [], 0
for package in json.load(sys.stdin)["packages"]:
    for src in sorted({os.path.dirname(t["src_path"]) for t in package["targets"] if "lib" in t["kind"]}):
        crates += 1
        for part in circles(modules(os.path.relpath(src))):
            problems.append(package["name"] + ": these files import each other: " + ", ".join(part))
for problem in problems:
    print("check-circles:", problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-circles: no file of the {crates} library crates imports another in a circle")
'
