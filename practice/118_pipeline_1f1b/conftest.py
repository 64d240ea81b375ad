"""This folder's tests import ``pipeline_grid.py`` (beside them) by name, here and on the ranks."""
from testkit.siblings import import_siblings

import_siblings(__file__, "pipeline_grid")
