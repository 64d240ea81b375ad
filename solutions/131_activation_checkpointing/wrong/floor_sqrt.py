"""sqrt_segments with k = floor(sqrt(L)) (int(math.sqrt(L))): for L = 5 segments of 2, and one segment more."""
import math

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_sqrt_segments"


def sqrt_segments(num_units):
    k = max(1, int(math.sqrt(num_units)))
    return [(start, min(start + k, num_units), True) for start in range(0, num_units, k)]
