"""The Python package is layered: its subpackages stand in the order of LAYERS, and each module
imports (at module level or inside a function) only modules of its own subpackage or of
subpackages below it. The package root (__init__, experiment) is the public facade above all of
them, which no subpackage imports. The module import graph has no cycle."""
import ast
import os

import sparse_operation_kit as sok

PACKAGE = "sparse_operation_kit"
ROOT = os.path.dirname(os.path.abspath(sok.__file__))

# Bottom to top (docs/ARCHITECTURE.md describes each).
LAYERS = [
    "runtime",
    "serving",
    "tables",
    "parallel",
    "lookup",
    "optimizers",
    "keras",
    "checkpoint",
    "adapters",
]
FACADE = {"__init__", "experiment"}  # the package root's modules
# Written into the package root by the wheel build (tools/pip_package/build_sok.sh) for
# runtime/_ops.py's version check, and absent from a source checkout: part of runtime.
GENERATED = {"_build_info": "runtime"}


def _modules():
    """Every module of the package, dotted below the package: "tables.tables", "runtime" (a
    subpackage's __init__), "__init__" (the package's own)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, ROOT)
        prefix = [] if rel == "." else rel.split(os.sep)
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            name = f[:-3]
            if name == "__init__":
                found.append(".".join(prefix) or "__init__")
            else:
                found.append(".".join(prefix + [name]))
    return sorted(found)


def _path(module):
    if module == "__init__":
        return os.path.join(ROOT, "__init__.py")
    path = os.path.join(ROOT, *module.split("."))
    return os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"


def _package_of(module):
    """The package a module's relative imports start from ("" for the root)."""
    if module == "__init__":
        return ""
    return module if os.path.isdir(os.path.join(ROOT, *module.split("."))) else module.rpartition(".")[0]


def _resolve(dotted, modules):
    """The package module that an imported dotted name (below the package) is, or that holds it."""
    parts = dotted.split(".") if dotted else []
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or "__init__"


def _imports(module, modules):
    """Package modules that `module` imports ("__init__" for the package itself)."""
    with open(_path(module)) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE:
                    found.add(_resolve(".".join(parts[1:]), modules))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package upward
                base = _package_of(module).split(".") if _package_of(module) else []
                base = base[: len(base) - (node.level - 1)]
                parts = base + (node.module.split(".") if node.module else [])
            else:
                parts = node.module.split(".") if node.module else []
                if not parts or parts[0] != PACKAGE:
                    continue
                parts = parts[1:]
            owner = ".".join(parts)
            for alias in node.names:  # from X import y: module X.y, or a name of X
                child = f"{owner}.{alias.name}" if owner else alias.name
                found.add(child if child in modules else _resolve(owner, modules))
    found.discard(module)
    return found


def import_graph():
    modules = set(_modules())
    return {m: _imports(m, modules | set(GENERATED)) for m in sorted(modules)}


def layer_of(module):
    """The subpackage a module belongs to, or None for the package root's modules."""
    if module in GENERATED:
        return GENERATED[module]
    return None if module in FACADE else module.split(".")[0]


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d, path + [d])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_subpackages_are_the_layers():
    subpackages = sorted(
        d for d in os.listdir(ROOT)
        if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))
    )
    assert subpackages == sorted(LAYERS)
    at_root = {m for m in _modules() if "." not in m} - set(LAYERS) - set(GENERATED)
    assert at_root == FACADE, f"modules outside the subpackages: {sorted(at_root - FACADE)}"
    for layer in LAYERS:  # no nested subpackages: one level, one layer
        below = [d for d in os.listdir(os.path.join(ROOT, layer))
                 if os.path.isfile(os.path.join(ROOT, layer, d, "__init__.py"))]
        assert not below, f"{layer}/ holds subpackages {below}"


def test_each_layer_imports_only_itself_and_lower_layers():
    graph = import_graph()
    assert {"parallel.local_rows", "parallel.exchange", "parallel.distributed",
            "tables.tables"} <= set(graph)
    wrong = []
    for module, deps in graph.items():
        layer = layer_of(module)
        if layer is None:
            continue
        for dep in deps:
            dep_layer = layer_of(dep)
            if dep_layer is None or LAYERS.index(dep_layer) > LAYERS.index(layer):
                wrong.append(f"{module} ({layer}) imports {dep} ({dep_layer or 'package root'})")
    assert not wrong, "imports against the layer order " + " < ".join(LAYERS) + ":\n" + "\n".join(
        sorted(wrong))


def test_layer_graph_has_no_cycle():
    graph = import_graph()
    layers = {layer: set() for layer in LAYERS}
    for module, deps in graph.items():
        if layer_of(module) is not None:
            layers[layer_of(module)] |= {layer_of(d) for d in deps if layer_of(d) is not None}
    for layer in layers:
        layers[layer].discard(layer)
    assert _cycle(layers) is None, f"subpackage cycle: {' -> '.join(_cycle(layers))}"


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_graph_sees_imports_of_every_form():
    modules = set(_modules())
    graph = import_graph()
    assert "lookup.lookup" in graph["__init__"]  # from sparse_operation_kit.lookup.lookup import x
    assert "tables.validation" in graph["tables.embedding_variable"]  # from ...tables import mod
    assert "runtime._ops" in graph["runtime.devices"]
    assert graph["runtime._ops"] == {"_build_info"}  # inside a function, generated by the build
    assert "__init__" in graph["experiment"]  # from sparse_operation_kit import *
    assert _resolve("tables.tables.StaticTable", modules) == "tables.tables"


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_one_process_and_distributed_paths_share_the_local_read():
    graph = import_graph()
    assert "parallel.local_rows" in graph["parallel.exchange"]
    assert "parallel.local_rows" in graph["parallel.distributed"]
    assert "parallel.exchange" not in graph["parallel.distributed"]
    assert "parallel.distributed" not in graph["parallel.local_rows"]


def test_ops_library_is_found_at_the_package_root():
    from sparse_operation_kit.runtime import _ops

    if not os.environ.get("SOK_OPS_LIBRARY"):
        assert os.path.dirname(os.path.abspath(_ops._find_library())) == ROOT


def test_tensorflow_internals_only_in_compat():
    for m in _modules():
        if m == "runtime.compat":
            continue
        with open(_path(m)) as f:
            source = f.read()
        assert "tensorflow.python" not in source, (
            f"{m} imports TensorFlow internals (keep them in runtime/compat.py)"
        )
        for protocol in (
            "_serialize_to_tensors",
            "_restore_from_tensors",
            "_gather_saveables_for_checkpoint",
            "_should_act_as_resource_variable",
        ):
            assert protocol not in source, (
                f"{m} uses TensorFlow's private {protocol} (keep it in runtime/compat.py)"
            )
