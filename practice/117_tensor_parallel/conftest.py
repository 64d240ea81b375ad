"""This folder's tests import ``shard_match.py`` (beside them) by name, here and on the ranks."""
from testkit.siblings import import_siblings

import_siblings(__file__, "shard_match")
