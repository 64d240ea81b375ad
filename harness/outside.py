"""``recording()``: the harness's own tracer outside its ranks, in a process the harness did not start.

A process that runs torch.distributed itself (a rank under torchrun: ``kit.launch``) can have its
communication recorded by the same kernels that record a harness rank's (``record.kernels``): every
``c10d::*`` op and functional collective, its bytes, group, peer and site, and when the code waited on
it.  There is no test process to stream to and no policy to enforce: the records stay here, and
the block ends by checking them against the groups' own op counters, as a harness call does.

    with harness.recording() as ops:
        train_step()
    ops            # list[CommOp], this process's ops in the block, in issue order

An op's ``wait_start`` stays None when nothing waited on it in the block from Python: a wait made in
C++ (DistributedDataParallel's reducer waits for its buckets at the end of backward), or one made
after the block ended.
"""
from __future__ import annotations

from contextlib import contextmanager

from .errors import HarnessError
from .trace import CommOp

_FIELDS = tuple(CommOp.__dataclass_fields__)
_open_blocks: list = []   # the block now recording, if any (blocks do not nest)


@contextmanager
def recording():
    """Record this process's communication for the block; yields the list of ``CommOp`` filled as it ends.

    Call it after ``init_process_group``.  Blocks run one at a time, never nested, and never inside
    ``harness.run``'s ranks (they have their own record).  Raises ``TraceTampered`` if a group's op
    counter moved by other than the recorded ops account for: something ran out of the tracer's sight.
    """
    recorder = _this_process_recorder()
    if recorder.flight_fd is not None:
        raise HarnessError("harness.recording() is for a process the harness did not start: "
                           "inside harness.run the call's trace already records every op")
    if _open_blocks:
        raise HarnessError("harness.recording() blocks do not nest: end the outer one first")
    recorder.reset()
    ops: list = []
    _open_blocks.append(ops)
    try:
        yield ops
    finally:
        _open_blocks.clear()
        recorder.finish()
        recorder.works.clear()   # the block's records are final: let go of its Work objects and their tensors
        ops.extend(CommOp(**{name: op[name] for name in _FIELDS}) for op in recorder.ops)
    recorder.check_untampered()


def _this_process_recorder():
    """The process's recorder, installing the kernels the first time (they stay, as in a rank)."""
    import torch.distributed as dist
    from .record.kernels import install
    from .record.recorder import active
    if not dist.is_initialized():
        raise HarnessError("harness.recording() needs a process group: call dist.init_process_group first")
    return active() or install(dist.get_rank(), flight_fd=None)
