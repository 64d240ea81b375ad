"""This folder's tests import ``virtual_stages.py`` (beside them) by name."""
from testkit.siblings import import_siblings

import_siblings(__file__, "virtual_stages")
