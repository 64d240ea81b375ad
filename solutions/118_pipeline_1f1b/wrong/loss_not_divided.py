"""The last stage backwards loss_fn(out, target) without dividing by m: gradients and loss m times too big."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_pipeline_matches_single_process"


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    m = sum(1 for kind, _ in ops if kind == "F")
    return ref.run_pipeline(stage_module, ops, act_shape, inputs, targets,
                            None if loss_fn is None else (lambda out, y: loss_fn(out, y) * m), group)
