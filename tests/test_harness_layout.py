"""The engine stays an engine: it imports nothing from the judge app or the test helpers, no module of it
goes through the package front, it reads no environment variable, and each file has one job (~300 lines)."""
import ast
import os

import pytest

import harness

ENGINE = os.path.dirname(os.path.abspath(harness.__file__))
FILES = sorted(os.path.relpath(os.path.join(folder, f), ENGINE) for folder, _, files in os.walk(ENGINE)
               for f in files if f.endswith(".py"))
MAX_LINES = 300


def _tree(name: str) -> ast.Module:
    with open(os.path.join(ENGINE, name), encoding="utf-8") as f:
        return ast.parse(f.read(), filename=name)


@pytest.mark.parametrize("name", FILES)
def test_imports_stay_inside_the_engine_and_skip_its_front(name):
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [("." * node.level) + (node.module or "")]
            if node.level == name.count("/") + 1 and node.module is None:   # ``from . import x`` at the top
                fronted = [a.name for a in node.names if not os.path.isfile(os.path.join(ENGINE, a.name + ".py"))]
                if fronted:   # a module of the engine is fine; a name of the front is not
                    pytest.fail(f"{name}:{node.lineno} imports {fronted} through the package front")
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            assert top not in ("kit", "testkit"), f"{name}:{node.lineno} imports {module}"
            assert module != "harness" and not module.startswith("harness."), \
                f"{name}:{node.lineno} imports {module}: inside the engine, import its modules relatively"


@pytest.mark.parametrize("name", FILES)
def test_no_environment_variable_is_read(name):
    tree = _tree(name)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("getenv", "environb"):
            pytest.fail(f"{name}:{node.lineno} reads the environment")
        if isinstance(node, ast.Attribute) and node.attr == "environ":   # only ``os.environ[k] = v`` (a rank's TMPDIR)
            parent = parents.get(id(node))
            writes = isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store)
            assert writes, f"{name}:{node.lineno} reads os.environ (the engine is configured through harness.defaults)"


@pytest.mark.parametrize("name", FILES)
def test_each_file_is_short(name):
    with open(os.path.join(ENGINE, name), encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by job"
