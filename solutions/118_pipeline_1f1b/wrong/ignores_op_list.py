"""run_pipeline runs all forwards, then all backwards, whatever op list it is given."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_trace_follows_the_op_list"


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    ordered = [op for op in ops if op[0] == "F"] + [op for op in ops if op[0] == "B"]
    return ref.run_pipeline(stage_module, ordered, act_shape, inputs, targets, loss_fn, group)
