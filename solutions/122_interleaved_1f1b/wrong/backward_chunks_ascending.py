"""Backwards visit the chunks in forward order (chunk 0 first): a chunk's B runs before the next chunk's B it needs."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_dependencies_hold_across_virtual_stages"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)
    forwards = ref._megatron_order(p, m, v, "F")
    backwards = [("B", i, c) for _, i, c in forwards]
    return [ref._one_rank(forwards, backwards, ref._warmup(p, m, v, r)) for r in range(p)]
