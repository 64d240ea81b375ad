"""The record and its policing, inside each rank: every torch.distributed op, as it is issued and waited on.

``kernels`` puts the recorder in front of every c10d op; ``recorder`` keeps and streams the records;
``policy`` says what a call may issue; ``groups`` checks gloo's own op counters; ``integrity``
checks that learner code left all of it as installed.  What the records show is advisory: the
test process checks it against witnesses the rank cannot reach (``harness.probes``).
"""
