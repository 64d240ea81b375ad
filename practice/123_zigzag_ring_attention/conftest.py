"""This folder's tests import ``contiguous_ring.py`` by name, here and on the ranks: an oracle, kept out of this
folder (tests/oracles/)."""
from testkit.siblings import import_oracles

import_oracles(__file__, "contiguous_ring")
