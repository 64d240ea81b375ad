"""Stage 0 marks its micro-batches as requiring grad, so its first block all-reduces an unused input gradient."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bytes_per_step"


class Parallel3D(ref.Parallel3D):
    def _pipeline(self, xs, ys):
        return super()._pipeline([x.clone().requires_grad_() for x in xs], ys)
