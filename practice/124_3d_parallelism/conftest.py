"""This folder's tests import ``grid3d.py`` (beside them) by name, here and on the ranks."""
from testkit.siblings import import_siblings

import_siblings(__file__, "grid3d")
