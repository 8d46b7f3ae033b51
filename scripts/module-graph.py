#!/usr/bin/env python3
"""The library's module graph from its `crate::` paths, and the circles in it.

Usage: python3 scripts/module-graph.py [src-dir]   (default: src)

A module and its children count as one (src/kinds/*.rs is `kinds`). Every `crate::` or
`$crate::` path outside comments is an edge, `use` lines and paths written inline alike; a
name the crate root re-exports (`crate::Lock`, `crate::Error`) is an edge to the module that
defines it, found from lib.rs's `pub use` and `pub type` lines. Prints each module's
dependencies, then each circle (a strongly connected set of modules) with the lines that make
its edges. Exits 1 when there is a circle, so CI can keep the graph one-way.

It also checks the layers (docs/DESIGN.md, "Where things live"): the facade (`client`) over
the kinds, over the engine, over the connection, over the floor (settings, errors, owners,
metrics). A module imports only from the layers below its own (the floor's modules among
themselves too); and only the connection (and the facade, which builds it) touches fred's
command API — its clients, interfaces, `CustomCommand` — so every round trip goes through
`conn`. Exits 1 on a breach, naming its lines.
"""

import re
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else "src")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def code_of(text):
    """The text without comments, newlines kept so line numbers stay right. Whole-line and
    trailing `//` comments go (a `//` inside a string literal, as in a URL, is kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    lines = []
    for line in text.split("\n"):
        in_string = False
        cut = len(line)
        i = 0
        while i < len(line):
            c = line[i]
            if c == "\\" and in_string:
                i += 2
                continue
            if c == '"':
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                cut = i
                break
            i += 1
        lines.append(line[:cut])
    return "\n".join(lines)


def module_of(path):
    """The top-level module a file belongs to (`lib` for the crate root)."""
    rel = path.relative_to(SRC)
    if rel == Path("lib.rs"):
        return "lib"
    return rel.parts[0].removesuffix(".rs")


def group_items(text, start):
    """The top-level items of the `{...}` group opening at `start`, and where it ends."""
    depth, items, item = 0, [], ""
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
            if depth == 1:
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                items.append(item)
                return [s.strip() for s in items if s.strip()], i
        if depth == 1 and c == ",":
            items.append(item)
            item = ""
        else:
            item += c
    return items, len(text)


def first_segments(code):
    """(line, first path segment) of every `crate::` path in `code`."""
    found = []
    for m in re.finditer(r"(?<![A-Za-z0-9_])\$?crate::", code):
        line = code.count("\n", 0, m.start()) + 1
        rest = m.end()
        if code.startswith("{", rest):
            items, _ = group_items(code, rest)
            for item in items:
                seg = re.match(IDENT, item)
                if seg:
                    found.append((line, seg.group()))
        else:
            seg = re.match(IDENT, code[rest:])
            if seg:
                found.append((line, seg.group()))
    return found


def root_names(lib_code, modules):
    """Names the crate root re-exports or defines, mapped to the modules they come from."""
    names = {}
    for m in re.finditer(r"pub use (" + IDENT + r")::([^;]*);", lib_code):
        module, tail = m.group(1), m.group(2)
        if module not in modules:
            continue
        group = tail.find("{")
        if group >= 0:
            items, _ = group_items(tail, group)
            for item in items:
                names[re.split(r"\s+as\s+", item)[-1].split("::")[-1].strip()] = {module}
        else:
            names[re.split(r"\s+as\s+", tail)[-1].split("::")[-1].strip()] = {module}
    for m in re.finditer(r"pub type (" + IDENT + r")\b[^=]*=([^;]*);", lib_code):
        used = set()
        for ident in re.findall(IDENT, m.group(2)):
            used |= names.get(ident, set())
        names[m.group(1)] = used
    return names


# Layer of each top-level module: a module may import from higher numbers only (the floor,
# layer 4, from itself too).
LAYERS = {"client": 0, "kinds": 1, "engine": 2, "conn": 3,
          "config": 4, "error": 4, "metrics": 4, "owner": 4}
FLOOR = 4
# fred's command API: only these modules may name it.
FRED_API = re.compile(r"\bfred::(?:clients|interfaces|prelude)\b|\bCustomCommand\b|\bClientLike\b")
FRED_API_ALLOWED = {"conn", "client"}
# Modules still reaching fred's command API on their own, each with the reason; none should
# stay here for long.
FRED_API_EXCEPTIONS = {}


def layer_breaches(edges):
    """(module, dependency, lines) for every import that does not run downwards."""
    breaches = []
    for here, deps in edges.items():
        for dep, lines in deps.items():
            a, b = LAYERS.get(here), LAYERS.get(dep)
            if a is None or b is None:
                breaches.append((here, dep, ["module missing from LAYERS"]))
            elif not (b > a or (a == FLOOR and b == FLOOR)):
                breaches.append((here, dep, lines))
    return breaches


def fred_breaches(codes):
    """file:line of every use of fred's command API outside the modules allowed it."""
    found = []
    for f, code in codes.items():
        if module_of(f) in FRED_API_ALLOWED or module_of(f) == "lib":
            continue
        if str(f.relative_to(SRC)) in FRED_API_EXCEPTIONS:
            continue
        for m in FRED_API.finditer(code):
            found.append(f"{f}:{code.count(chr(10), 0, m.start()) + 1}: {m.group()}")
    return found


def main():
    files = sorted(SRC.rglob("*.rs"))
    codes = {f: code_of(f.read_text()) for f in files}
    lib_code = codes[SRC / "lib.rs"]
    modules = set(re.findall(r"^\s*(?:pub(?:\(crate\))? )?mod (" + IDENT + r");", lib_code, re.M))
    names = root_names(lib_code, modules)

    edges = {m: {} for m in modules}  # module -> {dependency: [file:line, ...]}
    for f, code in codes.items():
        here = module_of(f)
        if here == "lib":
            continue
        for line, seg in first_segments(code):
            targets = {seg} if seg in modules else names.get(seg, set())
            for target in targets - {here}:
                edges[here].setdefault(target, []).append(f"{f}:{line}")

    for m in sorted(modules):
        print(f"{m:17} -> {' '.join(sorted(edges[m])) or '-'}")

    # Tarjan's strongly connected components.
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            visit(v)

    failed = 0
    breaches = layer_breaches(edges)
    for here, dep, lines in breaches:
        print(f"layer breach: {here} -> {dep}: {', '.join(lines)}")
    fred = fred_breaches(codes)
    for line in fred:
        print(f"fred's command API outside conn: {line}")
    if breaches or fred:
        failed = 1
    else:
        print("layers: every import runs downwards; fred's command API only in conn")
    if not circles:
        print("circles: none")
        return failed
    for circle in circles:
        print(f"circle of {len(circle)}: {' '.join(circle)}")
        for a in circle:
            for b in circle:
                if b in edges[a]:
                    print(f"  {a} -> {b}: {', '.join(edges[a][b])}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
