"""The pipeline grid that judge.py 118 --show draws: its doctests are its examples."""
import doctest

from harness import pipeline_grid


def test_pipeline_grid_doctests():
    result = doctest.testmod(pipeline_grid)
    assert result.attempted and not result.failed
