"""The judge app stays an app: it uses only the engine's public API, knows no problem by number,
and reads the user's KIT_* overrides in one place (kit/config.py)."""
import ast
import os
import re

import pytest

import harness
import kit

APP = os.path.dirname(os.path.abspath(kit.__file__))
FILES = sorted(os.path.relpath(os.path.join(folder, f), APP) for folder, _, files in os.walk(APP)
               for f in files if f.endswith(".py"))   # kit/launch/ too
PUBLIC_MODULES = {"harness", "harness.errors"}


def _source(name: str) -> str:
    with open(os.path.join(APP, name), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("name", FILES)
def test_only_the_engines_public_api_is_imported(name):
    for node in ast.walk(ast.parse(_source(name))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("harness"):
            assert node.module in PUBLIC_MODULES, f"{name}:{node.lineno} imports {node.module}"
            for alias in node.names:
                assert alias.name in harness.__all__ or alias.name == "errors", \
                    f"{name}:{node.lineno} imports harness.{alias.name}, which is not public"
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name in PUBLIC_MODULES or not alias.name.startswith("harness"), \
                    f"{name}:{node.lineno} imports {alias.name}"
            assert not any(a.name.startswith("testkit") for a in node.names), f"{name}:{node.lineno}"


@pytest.mark.parametrize("name", FILES)
def test_no_problem_number_in_the_app(name):
    code = "\n".join(line.split("#")[0] for line in _source(name).splitlines())
    assert not re.search(r"\b1[12]\d\b", code), f"{name} names a problem by number: the catalogue says it"


@pytest.mark.parametrize("name", [f for f in FILES if f != "config.py"])
def test_environment_overrides_are_read_only_in_config(name):
    assert not re.search(r"environ(\.get)?\s*[\[(]\s*[\"']KIT_|getenv\(\s*[\"']KIT_", _source(name)), \
        f"{name} reads a KIT_* variable: read it in kit/config.py"


def test_an_installed_kit_holds_every_package_of_the_tree():
    """pyproject's package list takes in every folder of the three layers that is a package (harness.record,
    kit.launch ...): the README's editable install finds them all anyway, a plain ``pip install .`` only these."""
    tomllib = pytest.importorskip("tomllib")                                  # Python 3.11 on
    find_packages = pytest.importorskip("setuptools").find_packages         # a venv of 3.12 on has none
    root = os.path.dirname(APP)
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        listed = set(find_packages(root, **tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]))
    in_tree = {os.path.relpath(folder, root).replace(os.sep, ".") for layer in ("harness", "kit", "testkit")
               for folder, _, files in os.walk(os.path.join(root, layer)) if "__init__.py" in files}
    assert listed == in_tree, (sorted(in_tree - listed), sorted(listed - in_tree))
