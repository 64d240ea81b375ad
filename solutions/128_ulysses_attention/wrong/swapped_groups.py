"""Swaps the grid's roles: the all_to_all runs in the ring group and the ring in the Ulysses group.  Without a
causal mask the values even come out right (attention does not care in which order it meets the keys), but
every message crosses the grid the wrong way."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_usp_communication_stays_in_its_groups"


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return ref.Ulysses()(q, k, v, causal, ring_group, ulysses_group, what="usp_attention")
