"""f and g swapped: copy_to_tp all-reduces in forward, reduce_from_tp all-reduces in backward."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_copy_to_tp"


def copy_to_tp(x, group=None):
    return ref._ReduceFromTP.apply(x, group)


def reduce_from_tp(x, group=None):
    return ref._CopyToTP.apply(x, group)
