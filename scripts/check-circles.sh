#!/usr/bin/env bash
# Checks that no two files of a crate import each other, even by a detour
# (docs/design.md, "The crates"). In every library crate's sources, outside
# unit tests (a #[cfg(test)] module), comments and string literals, each
# path `crate::...`, `super::...`, `self::...` or `<child module>::...`
# (braced lists included) is an arrow from its file to the file that
# defines what it names, followed through the `use` lines of the files it
# passes (a name a file only imports from another crate is no arrow). A
# module's own submodules are its parts: its arrows to them do not count,
# theirs to it do. Prints the files of each circle and exits 1 on any; 0
# and one line when there is none.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
code=$(cat <<'PY'
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

def code_of(path):
    """The file's code outside its #[cfg(test)] module, comments and string
    literals blanked."""
    text = open(path, encoding="utf-8").read()
    tests = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\(\w+\))?\s+)?mod\s+\w+\s*\{", text)
    text = text[: tests.start()] if tests else text
    text = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)
    return "\n".join(re.sub(r"(^|\s)//.*$", "", line) for line in text.splitlines())

def expand(path):
    """a::{b, c::{d, e}} -> a::b, a::c::d, a::c::e"""
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

def segments(path):
    path = re.sub(r"\s+as\s+\w+$", "", re.sub(r"\s", " ", path).strip())
    return [s for s in re.sub(r"\s", "", path).split("::") if re.fullmatch(r"\w+", s)]

def paths(code):
    """Every path of `code` (`a::b`, braced lists expanded)."""
    for m in re.finditer(r"(?<![\w:])(\w+(?:::(?:\w+|\{[^;]*?\}))+)", code):
        for path in expand(m.group(1)):
            yield segments(path)

class Crate:
    def __init__(self, src):
        self.files = modules(src)
        self.code = {m: code_of(p) for m, p in self.files.items()}

    def defines(self, module, name):
        pattern = r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:async|const|unsafe|extern)\s+)*(?:struct|enum|fn|trait|type|const|static|union)\s+" + re.escape(name) + r"\b|macro_rules!\s*" + re.escape(name) + r"\b"
        return re.search(pattern, self.code[module]) is not None

    def imported(self, module, name):
        """The path `module` imports `name` by, if it does."""
        for m in re.finditer(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", self.code[module]):
            for path in expand(m.group(1)):
                alias = re.search(r"\s+as\s+(\w+)\s*$", path)
                segs = segments(path)
                if segs and ((alias and alias.group(1) == name) or (not alias and segs[-1] == name)):
                    return segs
        return None

    def target(self, module, segs, depth=0):
        """The file that defines what the path `segs` names from `module`,
        if it is in this crate."""
        if depth > 8 or not segs:
            return None
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base, rest = module, segs
            while rest and rest[0] in ("super", "self"):
                base = base[:-1] if rest[0] == "super" else base
                rest = rest[1:]
        elif module + (segs[0],) in self.files:
            base, rest = module, segs
        else:
            return None
        while rest and base + (rest[0],) in self.files:
            base, rest = base + (rest[0],), rest[1:]
        if base not in self.files:
            return None
        if not rest or self.defines(base, rest[0]):
            return base
        via = self.imported(base, rest[0])
        if via is not None:
            return self.target(base, via, depth + 1)
        return base

    def arrows(self):
        out = {}
        for module in self.files:
            # A module's own submodules are its parts: its arrows to them
            # are not counted, theirs to it are.
            out[module] = {t for s in paths(self.code[module])
                           if (t := self.target(module, s)) is not None
                           and t[: len(module)] != module}
        return out

def circles(crate):
    arrows = crate.arrows()
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
                found.append(sorted(crate.files[m] for m in part))
    sys.setrecursionlimit(10000)
    for v in crate.files:
        if v not in index:
            visit(v)
    return found

problems, crates = [], 0
for package in json.load(sys.stdin)["packages"]:
    for src in sorted({os.path.dirname(t["src_path"]) for t in package["targets"] if "lib" in t["kind"]}):
        crates += 1
        for part in circles(Crate(os.path.relpath(src))):
            problems.append(package["name"] + ": these files import each other: " + ", ".join(part))
for problem in problems:
    print("check-circles:", problem, file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-circles: no file of the {crates} library crates imports another in a circle")
PY
)
cargo metadata --format-version 1 --no-deps | python3 -c "$code"
