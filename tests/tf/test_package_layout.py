"""The Python package imports only downward: its module import graph (every import of a package
module, at module level or inside a function) has no cycle."""
import ast
import os

import sparse_operation_kit as sok

PACKAGE = "sparse_operation_kit"
ROOT = os.path.dirname(os.path.abspath(sok.__file__))


def _modules():
    return sorted(f[:-3] for f in os.listdir(ROOT) if f.endswith(".py"))


def _imports(module, modules):
    """Package modules that `module` imports ("__init__" for the package itself)."""
    with open(os.path.join(ROOT, module + ".py")) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if (
                node.module == PACKAGE
            ):  # from sparse_operation_kit import x: a module, or the package
                found |= {a.name if a.name in modules else "__init__" for a in node.names}
                continue
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE:
                found.add(parts[1] if len(parts) > 1 else "__init__")
    found.discard(module)
    return found


def import_graph():
    modules = _modules()
    return {m: _imports(m, modules) for m in modules}


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


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert {"local_rows", "exchange", "distributed", "tables"} <= set(graph)
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_one_process_and_distributed_paths_share_the_local_read():
    graph = import_graph()
    assert "local_rows" in graph["exchange"] and "local_rows" in graph["distributed"]
    assert "exchange" not in graph["distributed"] and "distributed" not in graph["local_rows"]


def test_tensorflow_internals_only_in_compat():
    for m in _modules():
        if m == "compat":
            continue
        with open(os.path.join(ROOT, m + ".py")) as f:
            source = f.read()
        assert "tensorflow.python" not in source, (
            f"{m}.py imports TensorFlow internals (keep them in compat.py)"
        )
        for protocol in (
            "_serialize_to_tensors",
            "_restore_from_tensors",
            "_gather_saveables_for_checkpoint",
            "_should_act_as_resource_variable",
        ):
            assert protocol not in source, (
                f"{m}.py uses TensorFlow's private {protocol} (keep it in compat.py)"
            )
