"""run_pipeline passes group ranks (stage +/- 1) as peers, without translating them to global ranks."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_pipeline_inside_a_group"


class _SameNumbers:
    """A stand-in for dist inside run_pipeline whose get_global_rank leaves the group rank as it is."""
    def __getattr__(self, name):
        return getattr(ref.dist, name)

    @staticmethod
    def get_global_rank(group, rank):
        return rank


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    real, ref.dist = ref.dist, _SameNumbers()
    try:
        return ref.run_pipeline(stage_module, ops, act_shape, inputs, targets, loss_fn, group)
    finally:
        ref.dist = real
