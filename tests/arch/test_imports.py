"""The import rule of DESIGN.md, checked on the source (ast, nothing executed): no cycle between our modules,
and every import points down the data flow

    __main__ -> cli -> demo/ -> loops/ (and the entry scripts) -> tools/ -> ray/ -> rollout/ -> backends/
    -> args.py -> plan.py -> config/, algorithms/, sample.py, utils/

with config/ and algorithms/ importing nothing else of ours. Imports inside functions count too: a lazy import
hides a dependency from start-up time, not from the design.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "slime_like"

# higher may import lower (or its own layer's package); see the module docstring
LAYER = {"__main__": 8, "cli": 7, "demo": 6.5, "loops": 6, "tools": 5.5, "ray": 5, "rollout": 4, "backends": 3,
         "args": 2.5, "plan": 2, "config": 1, "algorithms": 1, "sample": 0, "utils": 0}
SELF_CONTAINED = ("config", "algorithms")  # import nothing of ours outside themselves


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    """slime_like's modules: files reachable as packages (slime_compat/ holds the separate package `slime`, user
    code's view of slime_like, outside the layering)."""
    return {_module_name(p): p for p in PKG.rglob("*.py")
            if all((d / "__init__.py").exists() for d in p.parents if d != PKG.parent and PKG in (d, *d.parents))}


def _resolve(name: str, modules: dict) -> str | None:
    """The module a dotted name refers to (a submodule, a package, or the module defining the attribute)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: pathlib.Path, me: str, modules: dict) -> set:
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] if base else []
        else:
            continue
        for n in names:
            if n.startswith("slime_like"):
                target = _resolve(n, modules)
                if target and target != me:
                    out.add(target)
    return out


def _graph() -> dict:
    modules = _modules()
    return {m: _imports(p, m, modules) for m, p in modules.items()}


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycle():
    graph = _graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
            if len(scc) > 1:
                cycles.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_imports_follow_the_data_flow():
    bad = []
    for me, targets in sorted(_graph().items()):
        area = _area(me)
        if area == "__init__":
            continue
        for t in sorted(targets):
            there = _area(t)
            if there == area or there == "__init__":
                continue
            if area in SELF_CONTAINED or LAYER[there] >= LAYER[area]:
                bad.append(f"{me} imports {t}")
    assert bad == [], "imports against the data flow of DESIGN.md:\n" + "\n".join(bad)


def test_every_area_has_a_layer():
    assert {_area(m) for m in _modules()} - {"__init__"} <= set(LAYER)
