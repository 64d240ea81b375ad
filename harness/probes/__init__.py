"""Measurements and faults of a call, each a probe on one seam: ``harness.run(fn, n, ..., probes=[...])``."""
