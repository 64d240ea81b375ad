"""A property's cost figures, for the judge's cost table: the model's value beside the measured one.

The figures are the catalogue's ``cost`` names (the statement's concept section derives each); the test
computes the model's value from its case, and the measured value from the harness's trace (never from a
number the code under test reports).  Of a test's examples, the largest one's figures are shown: a tiny
case (one element, one rank) says little about a cost.
"""
_LARGEST: dict = {}   # a test's record_property -> the size of the case its figures are for


def record(record_property, case: str, size: float, **figures):
    """``figures``: name (underscores for spaces) -> (model, yours); ``case``: the example, in plain words;
    ``size``: how large it is (its bytes, say): only a larger case replaces the figures shown."""
    if size < _LARGEST.get(record_property, float("-inf")):
        return
    _LARGEST[record_property] = size
    record_property("cost", {"case": case, "figures": [
        {"figure": name.replace("_", " "), "model": model, "yours": yours} for name, (model, yours) in figures.items()]})
