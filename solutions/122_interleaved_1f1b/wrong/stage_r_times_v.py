"""simulate takes chunk c of rank r to be virtual stage r*v + c (a rank's chunks consecutive), not r + c*p."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_simulate_follows_the_dependencies"


def simulate(schedule, p, v, tf, tb):
    def op_at(kind, i, s):            # stage s on rank s // v, as its chunk s % v
        return s // v, (kind, i, s % v)

    def needs(r, op):
        kind, i, c = op
        s = r * v + c
        if kind == "F":
            return [op_at("F", i, s - 1)] * (s > 0)
        return [(r, ("F", i, c))] + [op_at("B", i, s + 1)] * (s < p * v - 1)

    return ref._timeline(schedule, needs, tf / v, tb / v)
