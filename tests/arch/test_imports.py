"""The import rule of docs/architecture.md, checked on the source (ast, nothing executed): no cycle between our
modules, and every import points down the data flow

    __main__ -> cli -> demo/ -> loops/ (and the entry scripts) -> tools/ -> ray/ -> args.py -> rollout/
    -> backends/ -> plan.py -> config/, algorithms/, sample.py, utils/ -> registry.py, multimodal/

(args.py, the parse with its role views, is the drivers' business: rollout/ and backends/ get a Namespace.)

with config/ and algorithms/ importing nothing else of ours but the ground floor: the table registry.py and
multimodal/ (images and the model's processor; both import nothing of ours). Imports inside functions count too: a lazy import
hides a dependency from start-up time, not from the design.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "slime_like"

# higher may import lower (or its own layer's package); see the module docstring
LAYER = {"__main__": 8, "cli": 7, "demo": 6.5, "loops": 6, "tools": 5.5, "ray": 5, "args": 4.5, "rollout": 4,
         "backends": 3, "plan": 2, "config": 1, "algorithms": 1, "sample": 0, "utils": 0, "registry": -1,
         "multimodal": -1}
SELF_CONTAINED = ("config", "algorithms", "registry")  # import nothing of ours outside themselves but GROUND
GROUND = ("registry", "multimodal")


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
            if (area in SELF_CONTAINED and there not in GROUND) or LAYER[there] >= LAYER[area]:
                bad.append(f"{me} imports {t}")
    assert bad == [], "imports against the data flow of docs/architecture.md:\n" + "\n".join(bad)


def test_every_area_has_a_layer():
    assert {_area(m) for m in _modules()} - {"__init__"} <= set(LAYER)


# backends/ packages every backend may use; each other package under backends/ is one backend
SHARED_BACKEND_PACKAGES = {"training", "engine_api", "trainer_api"}


def _backend(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "backends" and parts[2] not in SHARED_BACKEND_PACKAGES:
        return parts[2]
    return None


def test_no_backend_imports_another_backend():
    """A backend (megatron/, fsdp/, cpu_engine/, sglang/, vllm/, ...) reaches another only through the shared
    packages: the FSDP trainer must install and run without megatron-core, an engine without a trainer."""
    bad = [f"{me} imports {t}" for me, targets in sorted(_graph().items()) for t in sorted(targets)
           if _backend(me) and _backend(t) and _backend(t) != _backend(me)]
    assert bad == [], "\n".join(bad)


def test_fsdp_backend_never_imports_megatron_core():
    """`pip install ".[fsdp]"` has no megatron-core: nothing under backends/fsdp/ imports it, lazily or not (the
    run-time check is tests/fsdp/test_fsdp_without_megatron.py)."""
    bad = []
    for path in sorted((PKG / "backends" / "fsdp").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                    if n == "megatron" or n.startswith("megatron.")]
    assert bad == [], "\n".join(bad)
