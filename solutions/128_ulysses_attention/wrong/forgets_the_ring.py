"""USP without the ring: after the Ulysses exchange each rank attends within its own block of U shards only, so
queries never see the keys of the other ring ranks' blocks (right only when R = 1)."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_usp_matches_full_attention"


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return ref.Ulysses()(q, k, v, causal, ulysses_group, None, what="usp_attention")
