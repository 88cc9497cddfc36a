#!/usr/bin/env python3
"""Module import cycles in the workspace's crates.

For each crate (a directory with src/lib.rs or src/main.rs), every .rs file
is a module (mod.rs / lib.rs / main.rs name their directory's module). A
module depends on another when it names it by path: `crate::a::b`,
`super::x`, `self::x`, or a `use` tree of them (braces expanded). A path is
resolved to the deepest module it names. Declaring a child (`mod x;`) is
not a dependency. Inline `mod tests` blocks under `#[cfg(test)]` are
skipped (test code may look anywhere). Exit 1 and print every cycle (as a
strongly connected component) if any module imports one that imports it
back; exit 0 otherwise.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crates():
    out = []
    for d in [ROOT] + [os.path.join(ROOT, "crates", c) for c in sorted(os.listdir(os.path.join(ROOT, "crates")))]:
        src = os.path.join(d, "src")
        if os.path.isdir(src):
            out.append((os.path.relpath(d, ROOT) if d != ROOT else ".", src))
    return out


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def strip_tests(text):
    # drop `#[cfg(test)] mod name { ... }` blocks (brace matched)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    return text


def expand_use(tree):
    """Expand a use tree `a::{b, c::{d, e}}` into paths."""
    tree = tree.replace(" ", "").replace("\n", "")
    def rec(prefix, s):
        # s: a single tree
        k = s.find("{")
        if k < 0:
            return [prefix + s.split(" as ")[0]]
        head, body = s[:k], s[k + 1:s.rfind("}")]
        parts, depth, cur = [], 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                parts.append(cur); cur = ""; continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        if cur:
            parts.append(cur)
        res = []
        for p in parts:
            res += rec(prefix + head, p) if p else []
        return res
    return rec("", tree)


def resolve(mods, here, path, reexports=None):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] == "super":
        base = here
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    elif segs[0] == "self":
        base, segs = here, segs[1:]
    elif here + (segs[0],) in mods:
        base = here  # a child named relative to this module (2018 uniform paths)
    else:
        return None
    best = base
    cur = base
    rest = segs
    for s in segs:
        cur = cur + (s,)
        if cur in mods:
            best = cur
            rest = rest[1:]
        else:
            break
    # an item a module re-exports (`pub use child::Item`) is the child's
    if reexports and rest and (best, rest[0]) in reexports:
        return reexports[(best, rest[0])]
    return best


def graph(src):
    mods = {}
    has_lib = os.path.exists(os.path.join(src, "lib.rs"))
    for dp, _, fs in os.walk(src):
        for f in fs:
            # a package's main.rs uses its library by the crate's name, not crate::
            if f.endswith(".rs") and not (has_lib and dp == src and f == "main.rs"):
                p = os.path.join(dp, f)
                mods[module_of(src, p)] = p
    texts = {m: strip_comments(strip_tests(open(p, encoding="utf-8").read())) for m, p in mods.items()}
    # pub use re-exports: (module, name) -> the module the item comes from
    reexports = {}
    for m, text in texts.items():
        for u in re.finditer(r"\bpub(?:\([\w\s]+\))?\s+use\s+([^;]+);", text):
            for path in expand_use(u.group(1)):
                name = path.split("::")[-1]
                if name in ("self", "*"):
                    continue
                t = resolve(mods, m, path)
                if t is not None and t != m:
                    reexports[(m, name)] = t
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        text = texts[m]
        paths = []
        for u in re.finditer(r"\buse\s+([^;]+);", text):
            paths += expand_use(u.group(1))
        paths += re.findall(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text)
        # a child module named without a prefix: `child::Item`
        paths += [x for x in re.findall(r"(?<![\w:])(\w+(?:::\w+)+)", text) if m + (x.split("::")[0],) in mods]
        for path in paths:
            t = resolve(mods, m, path, reexports)
            if t is not None and t != m and t in mods:
                # a parent naming its own child (mod.rs re-exports) is still an import
                edges[m].add(t)
    return mods, edges


def sccs(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def main():
    bad = 0
    for name, src in crates():
        mods, edges = graph(src)
        for comp in sccs(edges):
            bad += 1
            names = ["::".join(c) or "<root>" for c in comp]
            print(f"{name}: cycle of {len(comp)} modules: {', '.join(names)}")
            if "-v" in sys.argv:
                for c in comp:
                    print("   ", "::".join(c) or "<root>", "->", ", ".join(sorted("::".join(t) or "<root>" for t in edges[c] if t in comp)))
    if bad:
        print(f"module-cycles: {bad} cycle(s)")
        return 1
    print("module-cycles: no module imports one that imports it back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
