"""The package's import graph, read from its source (nothing is imported): which module imports
which — at module level or inside a function, the two count alike —, its cycles, and the
package-level picture docs/architecture.md shows.

    python -m pipeline.common.layout           # the picture (the block in docs/architecture.md, "Layers")
    python -m pipeline.common.layout --check   # each import cycle and each unexplained lazy import; exit 1 if any

An import inside a function is an edge like any other: it runs later, but a cycle through it is a
cycle of responsibilities all the same. Outside ``pipeline/cli/`` such an import of ``pipeline.*``
says why it is not at module level with a ``# lazy: <reason>`` comment on its line (the heavy
library the imported module loads: numba, pydantic, ...). Imports under ``if TYPE_CHECKING:`` are
annotations, not edges. Standard library only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "pipeline"
ROOT = Path(__file__).resolve().parents[1]
#: The comment that states why an import of the package is inside a function.
LAZY_MARK = "# lazy:"
#: The command-line package: its modules import their stage inside the command (pipeline/cli/__init__.py).
CLI = f"{PACKAGE}.cli"


@dataclass(frozen=True)
class Import:
    """One import of a module of the package: where it is, what it reaches, and whether it sits
    inside a function (lazy) with its stated reason."""

    module: str  # the importing module
    path: Path
    target: str  # the module imported (a package's __init__ for names it defines)
    line: int
    lazy: bool
    reason: str | None


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _absolute(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _type_checking(tree: ast.Module) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: never run)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return found


def _known(target: str, known: Mapping[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports(name: str, path: Path, known: Mapping[str, Path]) -> list[Import]:
    """The imports of modules of the package in ``path`` (module ``name``), lazy ones included,
    ``TYPE_CHECKING`` ones left out. ``from a import b`` reaches ``a.b`` when that is a module."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    skip = _type_checking(tree)
    top = {id(n) for n in tree.body} | {
        id(n) for stmt in tree.body if isinstance(stmt, ast.If | ast.Try) for n in ast.walk(stmt)
    }
    found: list[Import] = []
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.ImportFrom):
            base = _absolute(name, path.name == "__init__.py", node)
            wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            wanted = [a.name for a in node.names]
        text = lines[node.lineno - 1]
        reason = text.split(LAZY_MARK, 1)[1].strip() or None if LAZY_MARK in text else None
        for want in wanted:
            if want != PACKAGE and not want.startswith(PACKAGE + "."):
                continue
            target = _known(want, known)
            if target is not None and target != name:
                found.append(Import(name, path, target, node.lineno, id(node) not in top, reason))
    return found


def all_imports(root: Path = ROOT) -> list[Import]:
    known = modules(root)
    return [imp for name, path in known.items() for imp in imports(name, path, known)]


def graph(found: Iterable[Import]) -> dict[str, set[str]]:
    """Module -> the modules importing it runs: each target and the packages above it (importing
    ``a.b.c`` runs ``a.b``'s ``__init__`` first), except the importer's own packages, which are
    being imported already."""
    out: dict[str, set[str]] = {}
    for imp in found:
        deps = out.setdefault(imp.module, set())
        parts = imp.target.split(".")
        for i in range(1, len(parts) + 1):
            dep = ".".join(parts[:i])
            if dep != imp.module and not imp.module.startswith(dep + "."):
                deps.add(dep)
    return out


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> ... -> a``) through each strongly connected group of ``edges``,
    sorted; [] when the graph is acyclic (Tarjan's algorithm, iterative)."""
    nodes = sorted(set(edges) | {d for ds in edges.values() for d in ds})
    succ = {n: sorted(edges.get(n, ())) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on.add(node)
            for j in range(i, len(succ[node])):
                nxt = succ[node][j]
                if nxt not in index:
                    work += [(node, j + 1), (nxt, 0)]
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    group = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        group.append(top)
                        if top == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return sorted(_cycle_in(set(g), succ) for g in groups)


def _cycle_in(group: set[str], succ: Mapping[str, list[str]]) -> list[str]:
    """A shortest cycle through the least node of ``group`` (breadth first within the group)."""
    first = min(group)
    prev: dict[str, str] = {}
    frontier = [first]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in succ[node]:
                if nxt not in group:
                    continue
                if nxt == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(prev[path[-1]])
                    return [first, *reversed(path[:-1]), first]
                if nxt not in prev:
                    prev[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle in {sorted(group)}")  # pragma: no cover - groups are cyclic


def unexplained_lazy(found: Iterable[Import]) -> list[Import]:
    """Imports of the package inside a function, outside the command-line package, that give no
    ``# lazy: <reason>``."""
    return [
        imp
        for imp in found
        if imp.lazy and imp.reason is None and imp.module != CLI and not imp.module.startswith(CLI + ".")
    ]


# -- the package-level picture --------------------------------------------------------------------


def unit(module: str) -> str:
    """The part of the package a module belongs to: its subpackage (``engine/``) or itself
    (``replay.py``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    if len(parts) > 2 or (ROOT / parts[1]).is_dir():
        return parts[1] + "/"
    return parts[1] + ".py"


def unit_graph(edges: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """``edges`` between the parts of the package (:func:`unit`), a part's own edges left out; the
    package's ``__init__`` (the version) and ``__main__`` (``python -m pipeline``) are left out."""
    out: dict[str, set[str]] = {}
    for mod, deps in edges.items():
        u = unit(mod)
        if u in ("__init__.py", "__main__.py"):
            continue
        out.setdefault(u, set()).update(unit(d) for d in deps if unit(d) not in (u, "__init__.py"))
    return out


def layers(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The parts in floors, the ground floor first: a part's floor is one above the highest floor
    of what it uses, so every arrow points down. ValueError naming a cycle when there is one."""
    found = cycles(edges)
    if found:
        raise ValueError("import cycle between parts of the package: " + " -> ".join(found[0]))
    floor: dict[str, int] = {}

    def level(node: str) -> int:
        if node not in floor:
            floor[node] = 1 + max((level(d) for d in edges.get(node, ())), default=-1)
        return floor[node]

    nodes = sorted(set(edges) | {d for ds in edges.values() for d in ds})
    for node in nodes:
        level(node)
    out: list[list[str]] = [[] for _ in range(max(floor.values(), default=-1) + 1)]
    for node in nodes:
        out[floor[node]].append(node)
    return out


def _reduced(edges: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` less every arrow implied by a longer path (transitive reduction of a DAG)."""
    memo: dict[str, set[str]] = {}

    def below(node: str) -> set[str]:
        if node not in memo:
            memo[node] = set()
            for d in edges.get(node, ()):
                memo[node] |= {d} | below(d)
        return memo[node]

    return {n: {d for d in ds if not any(d in below(o) for o in ds if o != d)} for n, ds in edges.items()}


#: What the picture says of a part that imports no other part.
NOTHING = "(no other part of the package)"


def picture(root: Path = ROOT) -> str:
    """The package's parts floor by floor, the top first; each with the parts it uses directly
    that no other part it uses already reaches (the rest follow through those)."""
    edges = unit_graph(graph(all_imports(root)))
    floors = layers(edges)
    direct = _reduced(edges)
    width = max(len(u) for floor in floors for u in floor)
    inside = _package_floors(graph(all_imports(root)), root)
    out = []
    for number, floor in reversed(list(enumerate(floors))):
        for u in floor:
            uses = " ".join(sorted(direct.get(u, ())))
            out.append(f"{number:>2}  {u:<{width}}  {'─▶ ' + uses if uses else NOTHING}".rstrip())
            if inside.get(u):
                out.append(f"{'':>2}  {'':<{width}}     {' '.join(inside[u])}")
    return "\n".join(out)


def _package_floors(edges: Mapping[str, set[str]], root: Path = ROOT) -> dict[str, list[str]]:
    """Per package part (``replay/``), its modules top first: a module above the modules of its
    package it imports (sub-packages as one name, ``profile/``)."""
    out: dict[str, list[str]] = {}
    for name in modules(root):
        u = unit(name)
        if not u.endswith("/") or name.count(".") < 2:
            continue
        out.setdefault(u, [])
    for u in out:
        prefix = f"{PACKAGE}.{u[:-1]}."

        def local(m: str, prefix: str = prefix, folder: Path = root / u[:-1]) -> str | None:
            if not m.startswith(prefix):
                return None
            head, _, rest = m[len(prefix) :].partition(".")
            return head + "/" if rest or (folder / head).is_dir() else head

        inner: dict[str, set[str]] = {}
        for mod, deps in edges.items():
            me = local(mod)
            if me is None:
                continue
            inner.setdefault(me, set()).update(d for d in (local(x) for x in deps) if d is not None and d != me)
        for mod in modules(root):
            me = local(mod)
            if me is not None:
                inner.setdefault(me, set())
        floors = layers(inner)
        out[u] = [m for floor in reversed(floors) for m in sorted(floor)]
    return out


def problems(root: Path = ROOT) -> list[str]:
    """One line per import cycle and per unexplained lazy import; [] when the layout holds."""
    found = all_imports(root)
    out = ["import cycle: " + " -> ".join(c) for c in cycles(graph(found))]
    for imp in unexplained_lazy(found):
        out.append(
            f"{imp.path.relative_to(root.parent)}:{imp.line}: imports {imp.target} inside a function with no "
            f"'{LAZY_MARK} <reason>' (move it to module level, or say why it is lazy)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--check"]):
        print("usage: python -m pipeline.common.layout [--check]", file=sys.stderr)
        return 2
    if args == ["--check"]:
        found = problems()
        for line in found:
            print(line)
        return 1 if found else 0
    print(picture())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
