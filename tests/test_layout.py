"""The house's layout, read from the import statements (no module is imported): shared code never
imports an algorithm, its family or an entry point, and the project's modules import each other
without a cycle."""

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = {"sft", "rm", "dpo", "ppo", "grpo", "opd", "rft", "grpo_figures", "ppo_family", "opd_family", "dpo_online", "qlearn"}
ENTRY_POINTS = {"train", "ladder", "sample", "export"}


def project_modules():
    """{module name: path} for the top-level .py files and envs/ (as envs.x; envs/__init__.py as envs)."""
    modules = {f[:-3]: os.path.join(ROOT, f) for f in os.listdir(ROOT) if f.endswith(".py")}
    for f in os.listdir(os.path.join(ROOT, "envs")):
        if f.endswith(".py"):
            modules["envs" if f == "__init__.py" else f"envs.{f[:-3]}"] = os.path.join(ROOT, "envs", f)
    return modules


def imports_of(path, modules):
    """The project modules a file imports, at any depth in the file (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def test_shared_modules_import_no_algorithm_and_no_entry_point():
    modules = project_modules()
    shared = {name for name in modules if name not in ALGORITHMS | ENTRY_POINTS}
    assert {"rollouts", "evaluation", "checkpoints", "distributed", "monitors", "paperwork"} <= shared
    wrong = {name: sorted(imports_of(modules[name], modules) & (ALGORITHMS | ENTRY_POINTS)) for name in shared}
    assert {name: up for name, up in wrong.items() if up} == {}


def test_the_import_graph_has_no_cycle():
    modules = project_modules()
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    graph["envs"] = {m for m in graph["envs"] if not m.startswith("envs.")}  # a package imports its own submodules
    done, on_path = set(), []

    def visit(name):
        if name in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(name):] + [name]))
        if name in done:
            return
        on_path.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        on_path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert len(done) == len(modules)


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """The checker itself: two modules that import each other are reported."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import g\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    try:
        test_the_import_graph_has_no_cycle()
    except AssertionError as e:
        assert "a -> b -> a" in str(e)
    else:
        raise AssertionError("the cycle a -> b -> a went unreported")
