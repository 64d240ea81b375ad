"""This folder's tests import ``virtual_stages.py``, an oracle kept out of this folder (tests/oracles/), by name."""
from testkit.siblings import import_oracles

import_oracles(__file__, "virtual_stages")
