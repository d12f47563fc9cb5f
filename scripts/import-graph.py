#!/usr/bin/env python3
"""The import graph of src/: which file names which (`use crate::...`, `crate::a::b` paths,
`super::`, `self::` and a declared child module's `child::` paths), its strongly connected
components (circles) and the edges that run up the layering.

    python3 scripts/import-graph.py            # summary: circles, back-edges
    python3 scripts/import-graph.py --edges    # every edge, file -> file
    python3 scripts/import-graph.py --check    # the summary; exit 1 on any circle or back-edge

Circles are counted at two levels: between top-level modules (a module's folder is one unit) and
between files (two files that reach each other through imports, e.g. `a.rs` names `b.rs` and
`b.rs` names `a.rs`). Test code is left out: `#[cfg(test)]` modules inline and `tests.rs` files
sit above everything they test. The layers are those of src/lib.rs's doc; an edge from a lower
layer to a higher one is a back-edge.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# Lowest first. A module not listed is placed with `data`.
LAYERS = [
    ["simd", "gemm", "cuda", "bytes", "device", "rng", "fault", "machine", "logging", "names"],
    ["store", "digest", "verify", "data", "arith", "progress", "tensorboard"],
    ["model"],
    ["sampler", "train"],
    ["jobs", "eval", "pretrain"],
    ["config"],
    ["stages"],
    ["report"],
    ["cmd", "main", "lib"],
]


# File circles left on purpose, by folder, with why; `--check` reports them but does not fail.
# None: verify/'s circle went with the units change (its shared types are in verify/types.rs).
ALLOWED_FILE_CIRCLES = {}


def layer_of(unit):
    top = unit.split("/")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return 1


def files():
    out = []
    for d, _, fs in os.walk(ROOT):
        for f in fs:
            if f.endswith(".rs"):
                out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def module_path(rel):
    """src-relative file -> module path list (`a/b/mod.rs` -> [a, b])."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main") and len(parts) > 1:
        parts = parts[:-1]
    elif parts == ["lib"] or parts == ["main"]:
        return []
    return parts


def resolve(parts, known, reexports=None):
    """The deepest file for a module path; a name a `mod.rs` re-exports from its child
    (`pub use child::Name`) resolves to the child's file."""
    for n in range(len(parts), 0, -1):
        p = "/".join(parts[:n])
        for cand in (p + ".rs", p + "/mod.rs"):
            if cand in known:
                if reexports and n < len(parts) and parts[n] in reexports.get(cand, {}):
                    return reexports[cand][parts[n]]
                return cand
    return None


PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)::\{([^;]*)\};", re.S)
CHILD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def strip_tests(text):
    """The text without its inline `#[cfg(test)] mod name { ... }` blocks."""
    while True:
        m = TEST_MOD.search(text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]


def is_test_file(rel):
    return rel.endswith("/tests.rs") or rel == "tests.rs"


INLINE_MOD = re.compile(r"(?<![\w:])(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
PUB_USE = re.compile(r"\bpub\s+use\s+(?:self::)?([A-Za-z_]\w*)::(\{[^;]*\}|[A-Za-z_]\w*)\s*;", re.S)


def split_inline(text):
    """(the file's own text, the text of its inline `mod name { ... }` blocks)."""
    inner = []
    while True:
        m = INLINE_MOD.search(text)
        if not m:
            return text, "\n".join(inner)
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        inner.append(text[m.end() : i - 1])
        text = text[: m.start()] + text[i:]


def source(rel):
    text = open(os.path.join(ROOT, rel)).read()
    return strip_tests(re.sub(r"//[^\n]*", "", text))


def reexports(known):
    """For each file, the names it re-exports from a child module's file."""
    out = {}
    for rel in known:
        me = module_path(rel)
        names = {}
        for child, items in PUB_USE.findall(source(rel)):
            target = resolve(me + [child], known)
            if not target or target == rel:
                continue
            for item in re.split(r"[{},\s]+", items):
                if item and item != "self":
                    names[item.split(" as ")[-1]] = target
        out[rel] = names
    return out


def edges():
    known = set(files())
    rex = reexports(known)
    out = defaultdict(set)
    for rel in known:
        if is_test_file(rel):
            continue
        me = module_path(rel)
        own, inner = split_inline(source(rel))
        # a file's own module for `super::`: a/b.rs and a/b/mod.rs both have parent a; inside an
        # inline `mod x { }` of the file, `super::` is the file itself
        refs = []
        for text, sup in ((own, me[:-1]), (inner, me)):
            for m in PATH.finditer(text):
                refs.append((m.group(1), m.group(2).strip(":").split("::"), sup))
            for m in USE_GROUP.finditer(text):
                for item in re.split(r",(?![^{]*\})", m.group(2)):
                    item = item.strip()
                    if not item:
                        continue
                    head = re.split(r"::|\s|\{", item)[0]
                    refs.append((m.group(1), [head], sup))
        # a declared child module named by a bare path (`child::Item`, `pub use child::Item`)
        for child in CHILD.findall(own):
            if child != "tests" and re.search(r"(?<![:\w])" + child + r"::", own):
                refs.append(("self", [child], None))
        for kind, parts, sup in refs:
            base = {"crate": [], "super": sup, "self": me}[kind]
            while parts and parts[0] == "super" and base:  # super::super::
                parts, base = parts[1:], base[:-1]
            target = resolve(base + parts, known, rex)
            if target and target != rel:
                out[rel].add(target)
    return out


def scc(nodes, adj):
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return comps


def main():
    e = edges()
    if "--edges" in sys.argv:
        for a in sorted(e):
            for b in sorted(e[a]):
                print(f"{a} -> {b}")
        return
    # a top-level module (its folder, subfolders included) is one unit
    def unit_of(rel):
        return rel.split("/")[0] if "/" in rel else rel[:-3]

    uadj = defaultdict(set)
    for a, bs in e.items():
        for b in bs:
            ua, ub = unit_of(a), unit_of(b)
            if ua != ub:
                uadj[ua].add(ub)
    units = sorted({unit_of(f) for f in files()})
    circles = [c for c in scc(units, uadj) if len(c) > 1]
    print(f"{len(files())} files in {len(units)} units (a top-level module is one unit)")
    print(f"circles between modules: {len(circles)}")
    for c in circles:
        inside = [f for f in files() if unit_of(f) in c]
        print(f"  {len(c)} units, {len(inside)} files: {', '.join(c)}")
    file_circles = [c for c in scc(files(), e) if len(c) > 1]
    allowed = [c for c in file_circles if len({f.split("/")[0] for f in c}) == 1
               and c[0].split("/")[0] in ALLOWED_FILE_CIRCLES]
    file_circles = [c for c in file_circles if c not in allowed]
    print(f"circles between files: {len(file_circles)}")
    for c in file_circles:
        print(f"  {len(c)} files: {', '.join(c)}")
    for c in allowed:
        why = ALLOWED_FILE_CIRCLES[c[0].split("/")[0]]
        print(f"  allowed: {len(c)} files: {', '.join(c)} ({why})")
    back = []
    for a, bs in e.items():
        for b in bs:
            ua, ub = unit_of(a), unit_of(b)
            if ua != ub and layer_of(ua) < layer_of(ub):
                back.append((a, b))
    print(f"back-edges (a lower layer naming a higher one): {len(back)}")
    for a, b in sorted(back):
        print(f"  {a} -> {b}")
    if "--check" in sys.argv and (circles or file_circles or back):
        sys.exit(1)


if __name__ == "__main__":
    main()
