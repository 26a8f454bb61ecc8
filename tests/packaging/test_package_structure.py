"""The package's shape (issues #21, #31, #40): imports flow one way (no cycle between kvbench modules), only down
the layers of :data:`LAYERS` (a module never imports one from a higher layer), no two packages import each other and
every package sits in one layer (folders are layers), and every module is small enough to read in one sitting (at
most :data:`MAX_LINES` lines unless its docstring states why, on a line starting ``Size:``).

Both checks read the source with :mod:`ast` (nothing is imported), so they cost well under a second.

Import graph: an edge ``a -> b`` for every ``import kvbench.b`` / ``from kvbench.b import x`` anywhere in module
``a``, at module level or inside a function (a deferred import is still a dependency; deferring one only hides a
cycle).  ``from kvbench.pkg import name`` points at the submodule ``kvbench.pkg.name`` when that is a module, else at
the package.  Not edges: the implicit import of a parent package when a submodule is imported (a package's
``__init__`` re-exporting its submodules is not a cycle), imports under ``if TYPE_CHECKING:`` (never executed), and
the dynamic plug-in discovery of ``kvbench.tasks.base`` (``importlib.import_module`` on a name built at run time).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import kvbench

PACKAGE_DIR = Path(kvbench.__file__).resolve().parent
#: Longest module (in lines) that needs no stated reason.
MAX_LINES = 500

#: The layers of kvbench, lowest first: layer name -> the modules and packages in it (a dotted prefix; a module
#: belongs to its longest listed prefix).  A module may import its own layer and the layers below, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations: errors, plain data, config schema, run-folder files",
        (
            "kvbench.errors",
            "kvbench.checks",
            "kvbench.lazy_exports",
            "kvbench.version",
            "kvbench.sample",
            "kvbench.sampling",
            "kvbench.registry",
            "kvbench.resources",
            "kvbench.budget",
            "kvbench.config",
            "kvbench.storage",
        ),
    ),
    (
        "kernels, metrics and views of run folders on plain tensors / strings / rows",
        ("kvbench.kernels", "kvbench.metrics", "kvbench.views"),
    ),
    ("cache, attention function", ("kvbench.cache", "kvbench.attention")),
    (
        "the eviction-method machinery every method builds on: pieces, knobs, wrappers, registry (issue #57)",
        ("kvbench.eviction",),
    ),
    ("eviction methods: one file per method family, nothing else (issue #57)", ("kvbench.methods",)),
    ("models and prompts", ("kvbench.models", "kvbench.prompting")),
    ("tasks", ("kvbench.tasks",)),
    ("inference: eviction session, prefill, generation, press hooks", ("kvbench.inference",)),
    ("one run and its results: runs what validation hands it, validates nothing", ("kvbench.run",)),
    ("consumers of runs: reporting, the bench", ("kvbench.reporting", "kvbench.bench")),
    (
        "the application layer (issue #57): CLI, catalogue, overrides, validation in one pass, Hydra's errors, "
        "sweeps, dashboards, the demo",
        ("kvbench.app",),
    ),
    (
        "entry points: public API, the lm-eval bridge",
        # kvbench.lmeval_task: the lm-eval task kind, a plug-in that the task registry finds by name
        # (kvbench.tasks.base.PLUGIN_TASK_MODULES; no module of the tasks layer imports it); it builds its datasets
        # with kvbench.lmeval.runner.
        ("kvbench", "kvbench.__main__", "kvbench.api", "kvbench.lmeval", "kvbench.lmeval_task"),
    ),
]


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` under the kvbench package."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imported_modules(tree: ast.AST, modules: set[str] | dict[str, Path]) -> set[str]:
    """The kvbench modules the ``import`` statements of ``tree`` load: ``import kvbench.m`` -> ``kvbench.m``;
    ``from kvbench.m import x`` -> ``kvbench.m.x`` when that is a module (a submodule of a package), else
    ``kvbench.m``."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module in modules and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        stack.extend(ast.iter_child_nodes(node))
    return found


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the kvbench modules it imports (see the module docstring for what counts); parsed once per session,
    callers must not modify it."""
    modules = module_files()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = imported_modules(tree, modules) - {name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one cycle path through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_path(graph, component) for component in components]


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path ``a -> b -> ... -> a`` inside a strongly connected component (breadth-first, shortest)."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    return component


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_sees_deferred_imports() -> None:
    source = (
        "import torch\nfrom kvbench import kernels, __version__\n"
        "def f():\n    from kvbench.run.runner import config_hash\n"
        "if TYPE_CHECKING:\n    import kvbench.cache.kv_cache\n"
    )
    modules = {"kvbench", "kvbench.kernels", "kvbench.run.runner", "kvbench.cache.kv_cache"}
    assert imported_modules(ast.parse(source), modules) == {"kvbench", "kvbench.kernels", "kvbench.run.runner"}


def test_no_import_cycle_in_kvbench() -> None:
    graph = import_graph()
    assert graph.get("kvbench.attention.function"), "the import graph came out empty"
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in kvbench:\n" + "\n".join("  " + " -> ".join(cycle) for cycle in cycles)


def layer_index(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    """Position in ``layers`` of the longest prefix that ``module`` (dotted) equals or lies under; None if none."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            # The root package ("kvbench", no dot) stands for its __init__ only, not for every module under it.
            covers = module == prefix or ("." in prefix and module.startswith(prefix + "."))
            if covers and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def imports_up_the_layers(
    graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]]
) -> tuple[list[str], list[str]]:
    """``(edges from a lower layer to a higher one, modules in no layer)``, each as a readable line."""
    upward, unplaced = [], sorted(module for module in graph if layer_index(module, layers) is None)
    for module, targets in sorted(graph.items()):
        own = layer_index(module, layers)
        for target in sorted(targets):
            their = layer_index(target, layers)
            if own is not None and their is not None and their > own:
                upward.append(f"{module} ({layers[own][0]}) -> {target} ({layers[their][0]})")
    return upward, unplaced


#: (importer, imported) package pairs kept apart although the layers would allow the import: reporting reads run
#: folders and the tasks' declarative data, never task code.
KEPT_APART = [("kvbench.reporting", "kvbench.tasks")]


def test_reporting_does_not_import_task_code() -> None:
    graph = import_graph()
    crossing = [
        f"{module} -> {target}"
        for importer, imported in KEPT_APART
        for module, targets in sorted(graph.items())
        if module.startswith(importer + ".")
        for target in sorted(targets)
        if target == imported or target.startswith(imported + ".")
    ]
    assert not crossing, "imports between packages kept apart: " + ", ".join(crossing)


def test_layer_check_reports_an_import_up_the_layers() -> None:
    layers = [("low", ("p.low",)), ("high", ("p", "p.high", "p.low.plugin"))]
    graph = {"p.low.a": {"p.low.b"}, "p.low.b": set(), "p.high.c": {"p.low.a"}, "p.low.plugin": {"p.high.c"}}
    graph["p"] = {"p.high.c"}
    assert imports_up_the_layers(graph, layers) == ([], [])
    graph["p.low.b"] = {"p.high.c"}
    graph["p.other"] = set()
    assert imports_up_the_layers(graph, layers) == (["p.low.b (low) -> p.high.c (high)"], ["p.other"])


def test_no_import_points_up_the_layers() -> None:
    upward, unplaced = imports_up_the_layers(import_graph(), LAYERS)
    assert not unplaced, "modules in no layer of LAYERS (add them where their imports put them): " + ", ".join(unplaced)
    assert not upward, "imports pointing up the layers of LAYERS:\n" + "\n".join("  " + line for line in upward)


def package_of(module: str) -> str:
    """The kvbench package a module belongs to: ``kvbench.<name>`` (a subpackage, or a module directly under
    kvbench, which is a package of its own); the root ``kvbench`` for its ``__init__``."""
    return ".".join(module.split(".")[:2])


def two_way_package_imports(graph: dict[str, set[str]]) -> list[str]:
    """Pairs of packages that import each other (each way one module edge or more), one readable line per pair
    naming the module edges of both ways."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            pair = (package_of(module), package_of(target))
            if pair[0] != pair[1]:
                edges.setdefault(pair, []).append(f"{module} -> {target}")
    return [
        f"{a} <-> {b}: {', '.join(edges[(a, b)])}; {', '.join(edges[(b, a)])}"
        for a, b in sorted(edges)
        if a < b and (b, a) in edges
    ]


def packages_in_several_layers(graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """Packages (:func:`package_of`) whose modules sit in more than one layer, one readable line each."""
    spread: dict[str, dict[str, list[str]]] = {}
    for module in sorted(graph):
        index = layer_index(module, layers)
        if index is not None:
            spread.setdefault(package_of(module), {}).setdefault(layers[index][0], []).append(module)
    return [
        f"{package}: " + "; ".join(f"{layer}: {', '.join(modules)}" for layer, modules in by_layer.items())
        for package, by_layer in sorted(spread.items())
        if len(by_layer) > 1
    ]


def test_package_checks_report_a_two_way_import_and_a_split_package() -> None:
    layers = [("low", ("p.low",)), ("high", ("p.high", "p.low.plugin"))]
    graph = {"p.low.a": {"p.low.b"}, "p.low.b": set(), "p.high.c": {"p.low.a"}, "p.high": {"p.high.c"}}
    assert two_way_package_imports(graph) == []
    assert packages_in_several_layers(graph, layers) == []
    graph["p.low.b"] = {"p.high"}  # a module of p.low imports the package p.high, which imports p.low
    assert two_way_package_imports(graph) == ["p.high <-> p.low: p.high.c -> p.low.a; p.low.b -> p.high"]
    graph["p.low.plugin"] = set()
    assert packages_in_several_layers(graph, layers) == ["p.low: low: p.low.a, p.low.b; high: p.low.plugin"]


def test_no_two_packages_import_each_other() -> None:
    pairs = two_way_package_imports(import_graph())
    assert not pairs, "packages importing each other (move modules to where their imports put them):\n" + "\n".join(
        "  " + pair for pair in pairs
    )


def test_every_package_sits_in_one_layer() -> None:
    split = packages_in_several_layers(import_graph(), LAYERS)
    assert not split, "packages spread over several layers of LAYERS:\n" + "\n".join("  " + line for line in split)


def _docstring_states_size_reason(path: Path) -> bool:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return any(line.strip().startswith("Size:") for line in docstring.splitlines())


def test_no_long_module_without_a_stated_reason() -> None:
    too_long = []
    for name, path in module_files().items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and not _docstring_states_size_reason(path):
            too_long.append(f"{name}: {lines} lines")
    assert not too_long, (
        f"modules over {MAX_LINES} lines without a 'Size:' line in their docstring saying why: " + ", ".join(too_long)
    )
