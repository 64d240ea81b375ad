"""This folder's tests import ``virtual_stages.py`` by name: an oracle, kept out of this folder (tests/oracles/)."""
from testkit.siblings import import_oracles

import_oracles(__file__, "virtual_stages")
