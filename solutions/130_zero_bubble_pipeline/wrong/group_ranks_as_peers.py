"""run_zero_bubble passes group ranks (stage +/- 1) as peers, without translating them to global ranks."""
from contextlib import contextmanager

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_pipeline_inside_a_group"


class _SameNumbers:
    """dist inside run_zero_bubble, whose get_global_rank leaves a group rank as it is."""
    def __getattr__(self, name):
        return getattr(_REAL, name)

    @staticmethod
    def get_global_rank(group, rank):
        return rank


_REAL = ref.dist


@contextmanager
def _patched():
    ref.dist = _SameNumbers()
    try:
        yield
    finally:
        ref.dist = _REAL


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    with _patched():
        return ref.run_zero_bubble(stage_module, ops, act_shape, inputs, targets, loss_fn, group)
