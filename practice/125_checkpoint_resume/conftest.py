"""This folder's tests import ``ckpt_data.py`` (beside them) by name, here and on the ranks."""
from testkit.siblings import import_siblings

import_siblings(__file__, "ckpt_data")
