#!/usr/bin/env python3
"""Fails when modules inside a crate import each other in a circle.

Usage: scripts/module-cycles.py [CRATE_DIR ...]
  (no argument: every crate of the workspace, found by its Cargo.toml)

For each crate, the module tree is read from the file layout under `src/` (`lib.rs`/`main.rs`
is the root, `a/mod.rs` and `a.rs` are `a`, `a/b.rs` is `a::b`) plus the inline `mod x { ... }`
blocks. Every path that names a module of the crate — `use crate::...`, `use super::...`,
`use self::...`, a child module used by its bare name, and the same paths written inline in
code — is an edge from the module that writes it to the module it names.

An edge counts between the two siblings under the modules' closest common ancestor: a use of
`crate::upstreams::state` from `proxy::route` is the edge `proxy -> upstreams` at the root.
So a circle between two folders fails as well as one between two files, and a module using its
own parent or child (re-exports, `use super::*` in tests) is no edge at all. `#[cfg(test)]`
modules are left out: tests may reach anywhere to set things up.

Comments (doc links included) and string literals are ignored. Exits 1 and prints every
circle, each edge with the first place that makes it; exits 0 when there is none.

`scripts/module-cycles.allow` lists crates (one directory a line, `#` starts a comment) whose
circles are known and being fixed: they are reported but do not fail the check. Remove a line
as soon as its crate is clean; the check says so when it is.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CHAR_LITERAL = re.compile(r"'(?:[^'\\\n]|\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.))'")
RAW_STRING = re.compile(r'b?r(#*)"')


def strip(text: str) -> str:
    """The text with comments and string/char literals blanked out (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        raw = RAW_STRING.match(text, i)
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + raw.group(1), raw.end())
            end = n if end < 0 else end + 1 + len(raw.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            char = CHAR_LITERAL.match(text, i)
            if char:
                out.append("' '")
                i = char.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def expand_use(tree: str) -> list[str]:
    """`a::{b, c::{d, e as f}, self}` -> ['a::b', 'a::c::d', 'a::c::e', 'a']."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)

    def parse(s: str, i: int, prefix: str) -> tuple[list[str], int]:
        paths: list[str] = []
        start = i
        while i < len(s):
            if s[i] == "{":
                inner, i = parse_group(s, i + 1, prefix + s[start:i])
                paths.extend(inner)
                return paths, i
            if s[i] in ",}":
                break
            i += 1
        item = prefix + s[start:i]
        item = item[: -len("::self")] if item.endswith("::self") else item
        paths.append(item.rstrip(":"))
        return paths, i

    def parse_group(s: str, i: int, prefix: str) -> tuple[list[str], int]:
        paths: list[str] = []
        while i < len(s) and s[i] != "}":
            inner, i = parse(s, i, prefix)
            paths.extend(inner)
            if i < len(s) and s[i] == ",":
                i += 1
        return paths, i + 1

    return parse(tree, 0, "")[0]


class Crate:
    def __init__(self, root: Path):
        self.root = root
        self.modules: set[tuple[str, ...]] = set()
        self.test_modules: set[tuple[str, ...]] = set()
        # (from, to) -> first place that makes it
        self.edges: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        self.files: dict[tuple[str, ...], Path] = {}
        src = root / "src"
        for path in sorted(src.rglob("*.rs")):
            rel = path.relative_to(src)
            if rel.parts[0] == "bin":
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] in ("mod",) or (len(parts) == 1 and parts[0] in ("lib", "main")):
                parts = parts[:-1]
            module = tuple(parts)
            if module == () and module in self.files and rel.name == "main.rs":
                continue  # a binary beside a library: its own crate, using the library by name
            self.files[module] = path
            self.modules.add(module)

    def children(self, module: tuple[str, ...]) -> set[str]:
        return {m[len(module)] for m in self.modules if len(m) == len(module) + 1 and m[:-1] == module}

    def scan(self) -> None:
        code = {module: strip(path.read_text(encoding="utf-8")) for module, path in self.files.items()}
        # Inline modules first, so that paths into them resolve.
        for module, text in code.items():
            for inline, _, _, test in self.inline_blocks(module, text):
                self.modules.add(inline)
                if test:
                    self.test_modules.add(inline)
            for match in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
                self.test_modules.add(module + (match.group(1),))
        for module, text in code.items():
            blocks = self.inline_blocks(module, text)
            for offset, line_text in self.statements(text):
                owner = module
                for inline, start, end, _ in blocks:
                    if start <= offset < end and len(inline) > len(owner):
                        owner = inline
                if any(owner[: len(t)] == t for t in self.test_modules):
                    continue
                line = text.count("\n", 0, offset) + 1
                for path in line_text:
                    target = self.resolve(owner, path)
                    if target is not None:
                        self.add_edge(owner, target, f"{os.path.relpath(self.files[module])}:{line}: {path}")

    def inline_blocks(self, module, text):
        """(module path, start, end, is_test) of every inline `mod x { ... }` of a file."""
        blocks = []
        stack: list[tuple[tuple[str, ...], int]] = []
        depth = 0
        opens: dict[int, tuple[tuple[str, ...], int, bool]] = {}
        pattern = re.compile(r"(#\[cfg\(test\)\]\s*)?(?:pub(?:\([^)]*\))?\s+)?\bmod\s+(" + IDENT + r")\s*\{|[{}]")
        for match in pattern.finditer(text):
            token = match.group(0)
            if token == "}":
                if depth in opens:
                    inline, start, test = opens.pop(depth)
                    blocks.append((inline, start, match.end(), test))
                    stack.pop()
                depth -= 1
                continue
            depth += 1
            if token != "{":
                parent = stack[-1][0] if stack else module
                inline = parent + (match.group(2),)
                opens[depth] = (inline, match.start(), bool(match.group(1)))
                stack.append((inline, depth))
        return blocks

    @staticmethod
    def statements(text: str):
        """(offset, [paths]) for every `use` tree and every inline `crate::`/`super::`/`self::` path."""
        used_spans = []
        for match in re.finditer(r"\buse\s+([^;]+);", text):
            used_spans.append((match.start(), match.end()))
            yield match.start(), expand_use(match.group(1))
        for match in re.finditer(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:::" + IDENT + r")+)", text):
            if any(a <= match.start() < b for a, b in used_spans):
                continue
            yield match.start(), [match.group(1)]

    def resolve(self, owner: tuple[str, ...], path: str):
        segments = [s for s in path.split("::") if s]
        if not segments:
            return None
        if segments[0] == "crate":
            base, rest = (), segments[1:]
        elif segments[0] in ("self", "super"):
            base, rest = owner, segments
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
        elif segments[0] in self.children(owner):
            base, rest = owner, segments
        else:
            return None  # another crate, std, or a local item
        target = base
        for segment in rest:
            if target + (segment,) in self.modules:
                target = target + (segment,)
            else:
                break
        return target

    def add_edge(self, source, target, where):
        common = 0
        while common < min(len(source), len(target)) and source[common] == target[common]:
            common += 1
        if common in (len(source), len(target)):
            return  # the same module, or a parent and its child
        edge = (source[: common + 1], target[: common + 1])
        self.edges.setdefault(edge, where)

    def cycles(self):
        graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
        for a, b in self.edges:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
        return [scc for scc in tarjan(graph) if len(scc) > 1]


def tarjan(graph):
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            result.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def name(module):
    return "crate::" + "::".join(module) if module else "crate"


def main(argv: list[str]) -> int:
    workspace = Path(__file__).resolve().parent.parent
    if argv:
        roots = [Path(a) for a in argv]
    else:
        roots = sorted(p.parent for p in workspace.glob("**/Cargo.toml")
                       if "target" not in p.parts and (p.parent / "src").is_dir()
                       and not any(part.startswith(".") for part in p.relative_to(workspace).parts))
    allow_file = workspace / "scripts" / "module-cycles.allow"
    allowed = set()
    if allow_file.exists():
        for line in allow_file.read_text(encoding="utf-8").splitlines():
            entry = line.split("#")[0].strip()
            if entry:
                allowed.add((workspace / entry).resolve())
    failed = False
    for root in roots:
        crate = Crate(root)
        crate.scan()
        known = root.resolve() in allowed
        cycles = crate.cycles()
        if known and not cycles:
            print(f"{os.path.relpath(root)}: no circle any more; remove it from {os.path.relpath(allow_file)}")
        for scc in cycles:
            failed = failed or not known
            members = set(scc)
            label = "known circle (allowed, being fixed)" if known else "modules import each other in a circle"
            print(f"{os.path.relpath(root)}: {label}: {', '.join(name(m) for m in scc)}")
            for (a, b), where in sorted(crate.edges.items()):
                if a in members and b in members:
                    print(f"  {name(a)} -> {name(b)}  ({where})")
    if failed:
        print("\nBreak each circle: move what both sides need into a module below both "
              "(see CONTRIBUTING.md, \"Module layering\").")
        return 1
    print(f"no module circles in {len(roots)} crate(s)" + (" (apart from the allowed ones above)" if allowed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
