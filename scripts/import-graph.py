#!/usr/bin/env python3
"""The import graph of src/: which file names which (`use crate::...`, `crate::a::b` paths,
`super::`), its strongly connected components (circles) and the edges that run up the layering.

    python3 scripts/import-graph.py            # summary: circles, back-edges
    python3 scripts/import-graph.py --edges    # every edge, file -> file

A circle is a set of top-level modules that reach each other through imports; a module's own
files naming each other (`verify/expr.rs` and `verify/mod.rs`) are one unit and not counted. The layers
are those of src/lib.rs's doc; an edge from a lower layer to a higher one is a back-edge.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

# Lowest first. A module not listed is placed with `data`.
LAYERS = [
    ["simd", "gemm", "cuda", "bytes", "rng", "fault", "machine", "logging"],
    ["store", "digest", "verify", "data", "arith", "progress"],
    ["model"],
    ["sampler", "train"],
    ["jobs", "eval", "pretrain"],
    ["config"],
    ["stages"],
    ["report"],
    ["cmd", "main", "lib"],
]


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


def resolve(parts, known):
    """The deepest file for a module path."""
    for n in range(len(parts), 0, -1):
        p = "/".join(parts[:n])
        for cand in (p + ".rs", p + "/mod.rs"):
            if cand in known:
                return cand
    return None


PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super)::\{([^;]*)\};", re.S)


def edges():
    known = set(files())
    out = defaultdict(set)
    for rel in known:
        text = open(os.path.join(ROOT, rel)).read()
        text = re.sub(r"//[^\n]*", "", text)
        me = module_path(rel)
        # a file's own module for `super::`: a/b.rs and a/b/mod.rs both have parent a
        parent = me[:-1]
        refs = []
        for m in PATH.finditer(text):
            refs.append((m.group(1), m.group(2).strip(":").split("::")))
        for m in USE_GROUP.finditer(text):
            for item in re.split(r",(?![^{]*\})", m.group(2)):
                item = item.strip()
                if not item:
                    continue
                head = re.split(r"::|\s|\{", item)[0]
                refs.append((m.group(1), [head]))
        for kind, parts in refs:
            base = [] if kind == "crate" else parent
            target = resolve(base + parts, known)
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
    print(f"circles: {len(circles)}")
    for c in circles:
        inside = [f for f in files() if unit_of(f) in c]
        print(f"  {len(c)} units, {len(inside)} files: {', '.join(c)}")
    back = []
    for a, bs in e.items():
        for b in bs:
            ua, ub = unit_of(a), unit_of(b)
            if ua != ub and layer_of(ua) < layer_of(ub):
                back.append((a, b))
    print(f"back-edges (a lower layer naming a higher one): {len(back)}")
    for a, b in sorted(back):
        print(f"  {a} -> {b}")


if __name__ == "__main__":
    main()
