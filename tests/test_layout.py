"""The package's layout rules (docs/architecture.md): no import cycles, the CLI is imported by no
stage, and command modules keep their stage's imports inside the command."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "pipeline"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path) -> set[str]:
    """Modules of ``pipeline`` imported when ``path`` is imported (module level; imports under
    ``if TYPE_CHECKING`` and inside functions run later or never)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pipeline"))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # importing a.b.c imports a and a.b first
        deps = {d for d in _top_level_imports(path) if d in modules}
        parents = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
        graph[name] = (deps | parents) - {name}
    return graph


def test_no_import_cycles() -> None:
    graph = _graph()
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            # a package's __init__ importing its own submodules is how packages re-export
            if dep.startswith(node + "."):
                continue
            if state.get(dep) == 1:
                cycle = [*stack[stack.index(dep) :], dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_no_stage_imports_the_cli() -> None:
    def is_cli(module: str) -> bool:
        return module == "pipeline.cli" or module.startswith("pipeline.cli.")

    for name, deps in _graph().items():
        if not is_cli(name) and name != "pipeline.__main__":  # python -m pipeline runs the CLI
            assert not any(is_cli(d) for d in deps), name


def test_command_modules_import_their_stage_inside_the_command() -> None:
    # pipeline.terminal: the one escaping function, standard library only
    allowed = {
        "pipeline", "pipeline.cli", "pipeline.cli.common", "pipeline.defaults", "pipeline.errors", "pipeline.terminal"
    }  # fmt: skip
    for path in sorted((PKG / "cli").glob("*.py")):
        heavy = {d for d in _top_level_imports(path) if d.startswith("pipeline") and d.rsplit(".", 1)[0] not in allowed}
        heavy = {d for d in heavy if d not in allowed}
        assert not heavy, f"{path.name} imports {sorted(heavy)} at module level"


def test_test_only_code_is_not_in_the_package() -> None:
    assert not (PKG / "published.py").exists()
    for path in PKG.rglob("*.py"):
        assert "import published" not in path.read_text(), path
