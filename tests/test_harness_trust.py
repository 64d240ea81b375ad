"""The trust boundary: learner code controls everything inside a rank, and nothing the test process
relies on can be forged from there.  Each test is named after the attack it stops.
"""
import os
import pickle
import uuid

import pytest
import torch
import torch.distributed as dist

import harness
from tests.harness_helpers import assert_fresh_world_works, pids


class _RunsCodeWhenUnpickled:
    """What a hostile rank would plant: unpickling it creates a file in the test process."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _hostile_pickle(marker: str) -> bytes:
    return pickle.dumps(_RunsCodeWhenUnpickled(marker))


# ---- no code from the ranks runs in the test process ----------------------------------------------

def return_a_hostile_object(marker):
    return {"value": _RunsCodeWhenUnpickled(marker)}


def raise_with_a_hostile_argument(marker):
    raise RuntimeError(_RunsCodeWhenUnpickled(marker))


def name_a_phase_with_a_hostile_object(marker):
    with harness.phase(_RunsCodeWhenUnpickled(marker)):
        pass


def send_a_pickled_reply_with_the_stolen_token(marker):
    """Finds the rank loop's pipe and token, and sends a pickle that runs code when loaded."""
    import gc
    import sys
    from multiprocessing.connection import Connection
    frame = sys._getframe(1)
    token = frame.f_locals["reply"].token
    conn = next(o for o in gc.get_objects() if isinstance(o, Connection) and o.writable and o.readable)
    conn.send_bytes(pickle.dumps((token, ("ok", _RunsCodeWhenUnpickled(marker), [], []))))
    return 1


def stream_a_pickled_record(marker):
    from harness.record.recorder import active
    os.write(active().flight_fd, _hostile_pickle(marker) + b"\n")
    return 1


@pytest.mark.parametrize("attack", [return_a_hostile_object, raise_with_a_hostile_argument,
                                    name_a_phase_with_a_hostile_object, send_a_pickled_reply_with_the_stolen_token,
                                    stream_a_pickled_record], ids=lambda f: f.__name__)
def test_a_hostile_object_in_any_reply_field_runs_no_code_in_the_test_process(attack, tmp_path):
    marker = str(tmp_path / "code-ran-in-the-test-process")
    try:
        harness.run(attack, 2, marker, timeout=30)
    except (harness.HarnessError, harness.TraceTampered):
        pass   # refused, one way or another: what matters is below
    assert not os.path.exists(marker), f"{attack.__name__}: code from a rank ran in the test process"
    assert harness.run(torch.distributed.get_rank, 2, timeout=30).values == [0, 1]


def test_a_return_value_that_is_not_plain_data_is_a_clear_error():
    with pytest.raises(harness.RankError, match=r"cannot be sent back: the return value\['value'\] is a .*_RunsCodeWhenUnpickled"):
        harness.run(return_a_hostile_object, 1, "/nonexistent/marker", timeout=30)


# ---- the record of communication is the test process's ---------------------------------------------

def all_reduce_then_rewrite_the_record():
    from harness.record.recorder import active
    t = torch.ones(4)
    dist.all_reduce(t)
    active().ops[0].update(kind="broadcast", in_bytes=1, site="elsewhere.py:1")
    return t.tolist()


def test_rewriting_op_records_after_the_fact_is_caught():
    with pytest.raises(harness.TraceTampered, match="differ from what it streamed"):
        harness.run(all_reduce_then_rewrite_the_record, 2, timeout=30)


def all_reduce_then_forge_a_phase():
    from harness.record.recorder import active
    dist.all_reduce(torch.ones(4))
    active().phases.append({"rank": dist.get_rank(), "name": "forged", "step": 0, "start": 0, "end": 1})


def test_a_phase_added_after_the_fact_is_not_in_the_trace():
    result = harness.run(all_reduce_then_forge_a_phase, 2, timeout=30)
    for rank in range(2):
        (op,) = result.trace.ops(rank)
        assert (op.kind, op.in_bytes) == ("all_reduce", 16) and "test_harness_trust.py" in op.site
        assert result.trace.phases(rank) == []


def clear_the_policy_then_all_reduce():
    from harness.record.recorder import active
    from harness.record.policy import Policy
    active().policy = Policy()
    dist.all_reduce(torch.ones(2))


def test_clearing_the_policy_inside_the_rank_does_not_lift_it():
    with pytest.raises(harness.ForbiddenOp, match="all_reduce is not allowed"):
        harness.run(clear_the_policy_then_all_reduce, 2, forbid={"all_reduce"}, timeout=30)


def stream_a_forged_record():
    import json
    from harness.record.recorder import active
    recorder = active()
    forged = {"ev": "issue", "i": 0, "op": {"rank": dist.get_rank(), "index": 0, "kind": "all_reduce",
                                             "name": "c10d.allreduce_.default", "shapes": [[4]],
                                             "dtypes": ["torch.float32"], "in_bytes": 16, "out_bytes": 16,
                                             "peer": None, "group": [0, 1], "splits": None, "phase": None,
                                             "step": None, "site": "x.py:1", "issued_at": 0.0}}
    os.write(recorder.flight_fd, (json.dumps(forged) + "\n").encode())


def test_a_forged_record_in_the_stream_is_caught():
    before = pids(2)
    with pytest.raises(harness.TraceTampered, match="streamed 1 op records but its tracer holds 0"):
        harness.run(stream_a_forged_record, 2, timeout=30)
    assert_fresh_world_works(2, before)


# ---- each rank gets only its own inputs --------------------------------------------------------------

def search_this_process_for(secret):
    """Everything a rank can reach: every object gc tracks, and every frame's locals."""
    import gc
    import sys
    if secret is not None:
        return "my own input"
    import re
    pattern = re.compile(SECRET_PREFIX + "[0-9a-f]{32}")   # the prefix alone is in this very function

    def holds_a_secret(x):
        return bool(pattern.search(x if isinstance(x, str) else x.decode("latin-1") if isinstance(x, bytes) else ""))

    for obj in gc.get_objects():
        if isinstance(obj, (dict, list, tuple)):
            if any(holds_a_secret(x) for x in (obj.values() if isinstance(obj, dict) else obj)):
                return "found in a container"
    for frame in sys._current_frames().values():
        while frame is not None:
            if any(holds_a_secret(v) for v in frame.f_locals.values()):
                return "found in a frame"
            frame = frame.f_back
    return "not found"


SECRET_PREFIX = "secret-of-another-rank-"


def test_a_rank_cannot_find_another_ranks_inputs_or_the_expected_values():
    secret = SECRET_PREFIX + uuid.uuid4().hex
    expected_values = {"answer": secret}   # held by the test process only  # noqa: F841
    found = harness.run(search_this_process_for, 3, harness.per_rank([None, secret, None]), timeout=60).values
    assert found == ["not found", "my own input", "not found"]


def storage_bytes(x):
    return x.untyped_storage().nbytes()


def test_a_view_sent_to_one_rank_does_not_carry_the_other_ranks_elements():
    whole = torch.arange(1000, dtype=torch.float32)
    sizes = harness.run(storage_bytes, 4, harness.per_rank(list(whole.chunk(4))), timeout=60).values
    assert sizes == [1000] * 4   # 250 float32 each: only its own chunk, not the 4000-byte storage
