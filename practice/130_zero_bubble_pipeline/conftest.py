"""This folder's tests import ``zb_rules.py`` by name: an oracle, kept out of this folder (tests/oracles/)."""
from testkit.siblings import import_oracles

import_oracles(__file__, "zb_rules")
