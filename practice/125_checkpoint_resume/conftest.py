"""This folder's tests import ``ckpt_data.py`` by name, here and on the ranks: an oracle, kept out of this
folder (tests/oracles/)."""
from testkit.siblings import import_oracles

import_oracles(__file__, "ckpt_data")
