"""The pipeline grid that problem 118's tests draw (beside them, in practice/): its doctests are its examples."""
import doctest
import os

from testkit.siblings import import_siblings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
(pipeline_grid,) = import_siblings(os.path.join(ROOT, "practice", "118_pipeline_1f1b", "conftest.py"), "pipeline_grid")


def test_pipeline_grid_doctests():
    result = doctest.testmod(pipeline_grid)
    assert result.attempted and not result.failed
