"""The package's layout rules (docs/architecture.md, pipeline/common/layout.py): no import cycles, an import
inside a function counted like any other, a lazy import of the package outside the command line
saying why it is lazy, the CLI imported by no stage, command modules keeping their stage's imports
inside the command, and the layer picture in docs/architecture.md being the code's."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.common import layout

PKG = Path(__file__).resolve().parents[1] / "pipeline"
DOC = PKG.parent / "docs" / "architecture.md"
BEGIN = "<!-- layers: python -m pipeline.common.layout -->"
END = "<!-- /layers -->"


def _module_graph() -> dict[str, set[str]]:
    return layout.graph(layout.all_imports())


def test_no_import_cycles_lazy_imports_included() -> None:
    found = layout.cycles(_module_graph())
    assert not found, "\n".join("import cycle: " + " -> ".join(c) for c in found)


def test_every_lazy_import_of_the_package_says_why() -> None:
    """Outside pipeline/cli/, an import of pipeline.* inside a function has a '# lazy: <reason>'
    (the heavy library it keeps from loading); every other one is at module level."""
    missing = layout.unexplained_lazy(layout.all_imports())
    assert not missing, "\n".join(f"{i.path.relative_to(PKG.parent)}:{i.line}: {i.target}" for i in missing)
    assert layout.problems() == []


def test_lazy_imports_are_seen_and_counted() -> None:
    """The checker reads the real tree's function-local imports (the command modules import their
    stage inside the command), so a cycle through one would be found."""
    found = layout.all_imports()
    lazy = [i for i in found if i.lazy]
    assert any(i.module == "pipeline.cli.replay" and i.target == "pipeline.replay.run" for i in lazy)
    assert all(i.reason for i in lazy if not i.module.startswith("pipeline.cli"))


def _tree(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pipeline"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


def test_a_function_local_cycle_is_an_import_cycle(tmp_path: Path) -> None:
    pkg = _tree(
        tmp_path,
        {
            "a.py": "from pipeline.b import g\n\ndef f():\n    return g()\n",
            "b.py": "def g():\n    from pipeline.a import f  # lazy: only to show the cycle\n    return f\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline.a import f\n",
        },
    )
    found = layout.all_imports(pkg)
    assert layout.cycles(layout.graph(found)) == [["pipeline.a", "pipeline.b", "pipeline.a"]]
    assert layout.problems(pkg) == ["import cycle: pipeline.a -> pipeline.b -> pipeline.a"]
    # an annotation-only import is no edge; the module-level view alone saw no cycle
    assert "pipeline.c" not in layout.graph(found)
    assert layout.cycles(layout.graph(i for i in found if not i.lazy)) == []


def test_a_lazy_import_without_a_reason_is_named(tmp_path: Path) -> None:
    pkg = _tree(
        tmp_path,
        {
            "low.py": "X = 1\n",
            "high.py": "def f():\n    from pipeline.low import X\n    return X\n",
            "cli/__init__.py": "",
            "cli/cmd.py": "def run():\n    from pipeline.high import f\n    return f()\n",
        },
    )
    assert layout.problems(pkg) == [
        "pipeline/high.py:2: imports pipeline.low inside a function with no '# lazy: <reason>' "
        "(move it to module level, or say why it is lazy)"
    ]
    (pkg / "high.py").write_text("def f():\n    from pipeline.low import X  # lazy: numba\n    return X\n")
    assert layout.problems(pkg) == []


def test_importing_a_submodule_runs_its_package(tmp_path: Path) -> None:
    """``from pipeline.sub.x import y`` runs pipeline/sub/__init__.py first: a cycle through a
    package's re-exports is a cycle (the project's catalog <-> project cycle was one)."""
    pkg = _tree(
        tmp_path,
        {
            "sub/__init__.py": "from pipeline.sub.names import n\n",
            "sub/names.py": "def n():\n    from pipeline.proj import p  # lazy: x\n    return p\n",
            "sub/entries.py": "E = 1\n",
            "proj.py": "from pipeline.sub.entries import E\np = E\n",
        },
    )
    cycle = ["pipeline.proj", "pipeline.sub", "pipeline.sub.names", "pipeline.proj"]
    assert layout.problems(pkg) == ["import cycle: " + " -> ".join(cycle)]


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 7).flatmap(lambda n: st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)))))
def test_cycles_finds_a_cycle_exactly_when_there_is_one(edges: set[tuple[int, int]]) -> None:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        if a != b:
            graph.setdefault(f"m{a}", set()).add(f"m{b}")
    nodes = sorted(set(graph) | {d for ds in graph.values() for d in ds})
    # brute force: a cycle exists iff no order of the nodes has every arrow pointing forward
    acyclic = any(
        all(order.index(a) < order.index(b) for a, ds in graph.items() for b in ds)
        for order in itertools.permutations(nodes)
    )
    found = layout.cycles(graph)
    assert (found == []) == acyclic
    for cycle in found:  # each one a real closed path
        assert cycle[0] == cycle[-1] and len(cycle) >= 3
        assert all(b in graph[a] for a, b in itertools.pairwise(cycle))


def test_no_stage_imports_the_cli() -> None:
    def is_cli(module: str) -> bool:
        return module == "pipeline.cli" or module.startswith("pipeline.cli.")

    for name, deps in _module_graph().items():
        if not is_cli(name) and name != "pipeline.__main__":  # python -m pipeline runs the CLI
            assert not any(is_cli(d) for d in deps), name


def test_command_modules_import_their_stage_inside_the_command() -> None:
    # pipeline.common.terminal: the one escaping function, standard library only
    allowed = {
        "pipeline", "pipeline.cli", "pipeline.cli.common", "pipeline.common",
        "pipeline.common.defaults", "pipeline.common.errors", "pipeline.common.terminal",
    }  # fmt: skip
    for imp in layout.all_imports():
        if imp.module.startswith("pipeline.cli") and not imp.lazy:
            assert imp.target in allowed, f"{imp.path.name} imports {imp.target} at module level"


def test_the_ground_floor_imports_nothing_of_the_package() -> None:
    """pipeline/common/units.py, system.py, blockhash.py, errors.py and terminal.py are the ground floor:
    anything may use them because they use nothing of the package."""
    for name in ("units", "system", "blockhash", "errors", "terminal"):
        assert [i.target for i in layout.all_imports() if i.module == f"pipeline.{name}"] == [], name


def test_the_layer_picture_in_the_docs_is_the_codes() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"docs/architecture.md lost its {BEGIN} ... {END} block"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip().removeprefix("```").removesuffix("```").strip("\n")
    assert block == layout.picture(), (
        "docs/architecture.md's layer picture differs from the code's import graph; regenerate it with "
        "`python -m pipeline.common.layout` and paste its output between the markers"
    )


def test_the_picture_points_every_arrow_down() -> None:
    floors = layout.layers(layout.unit_graph(_module_graph()))
    where = {u: n for n, floor in enumerate(floors) for u in floor}
    for u, deps in layout.unit_graph(_module_graph()).items():
        assert all(where[d] < where[u] for d in deps), u
    # the ground floor is the common package; the stages follow the data's way through the tree
    assert floors[0] == ["common/"]
    for low, high in [("ingest/", "classify/"), ("costmodel/", "engine/"), ("engine/", "replay/"),
                      ("replay/", "economics/"), ("economics/", "plan/"), ("replay/", "publish/")]:  # fmt: skip
        assert where[low] < where[high], (low, high)


def test_test_only_code_is_not_in_the_package() -> None:
    assert not (PKG / "published.py").exists()
    for path in PKG.rglob("*.py"):
        assert "import published" not in path.read_text(), path
