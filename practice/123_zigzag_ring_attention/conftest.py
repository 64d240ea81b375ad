"""This folder's tests import ``contiguous_ring.py`` (beside them) by name, here and on the ranks."""
from testkit.siblings import import_siblings

import_siblings(__file__, "contiguous_ring")
