"""This folder's tests import ``checkpoint_plans.py`` by name: an oracle, kept out of this folder (tests/oracles/)."""
from testkit.siblings import import_oracles

import_oracles(__file__, "checkpoint_plans")
