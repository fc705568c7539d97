"""The house's layout, read from the import statements (no module is imported; experiments/reading_path.py
draws the same house): the top level holds the design card's scripts, the shared machinery lives in
nanopost/ and never imports an algorithm, the lab or an entry point, every variant of the lab imports
the plain algorithm it changes and no algorithm imports the lab, model.py imports nothing of the
project, and the rooms (top-level files and folders) import each other without a cycle on at most six floors."""

import ast
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import reading_path  # noqa: E402

ALGORITHMS = {"sft", "rm", "dpo", "ppo", "grpo", "opd", "rft", "qlearn"}
SCRIPTS = {"model", "sampler", "train", "sample", "ladder", "export", "report"}
MAX_FLOORS = 6


def imported_modules(path):
    """Every module a file imports, at any depth (lazy imports too), as written."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_top_level_holds_the_design_cards_scripts():
    top = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    assert top == ALGORITHMS | SCRIPTS, sorted(top ^ (ALGORITHMS | SCRIPTS))
    assert {"nanopost", "lab", "envs", "config", "experiments"} <= set(reading_path.rooms())


def test_shared_code_imports_no_algorithm_no_variant_and_no_entry_point():
    house = reading_path.house()
    assert house["arrows"]["nanopost"] <= {"model", "sampler", "envs"}, house["arrows"]["nanopost"]
    assert house["arrows"]["envs"] == set() and house["arrows"]["sampler"] <= {"model"}


def test_model_imports_nothing_of_the_project_and_no_package_but_torch():
    project = set(reading_path.rooms())
    modules = {m.split(".")[0] for m in imported_modules(os.path.join(ROOT, "model.py"))}
    assert not modules & project
    assert modules - set(sys.stdlib_module_names) == {"torch"}


def test_every_variant_imports_the_algorithm_it_changes_and_no_algorithm_imports_the_lab():
    lab = os.path.join(ROOT, "lab")
    variants = [f for f in os.listdir(lab) if f.endswith(".py") and f != "__init__.py"]
    assert variants
    for f in variants:
        tree = ast.parse(open(os.path.join(lab, f)).read())
        base = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "base" for t in node.targets)]
        assert len(base) == 1 and base[0] in ALGORITHMS, f"lab/{f}: base = 'the algorithm it changes'"
        assert base[0] in imported_modules(os.path.join(lab, f)), f"lab/{f} does not import {base[0]}"
        assert ast.get_docstring(tree), f"lab/{f}: a docstring with its formula and its paper"
    for name in ALGORITHMS | SCRIPTS:
        assert not any(m == "lab" or m.startswith("lab.") for m in imported_modules(os.path.join(ROOT, name + ".py"))), name


def test_the_house_has_no_cycle_and_at_most_six_floors():
    floors = reading_path.house()["floors"]
    assert max(floors.values()) <= MAX_FLOORS, sorted(floors.items(), key=lambda kv: -kv[1])


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """The checker itself: two rooms that import each other are reported."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import g\n")
    monkeypatch.setattr(reading_path, "ROOT", str(tmp_path))
    with pytest.raises(ValueError, match="a -> b -> a"):
        reading_path.house()
