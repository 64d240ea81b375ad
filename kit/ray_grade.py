"""grade --ray ADDRESS: each submission judged as a task on a Ray cluster, one task per student.

``grade`` keeps its one loop over the students' rows; ``RayJudges`` is the runner that feeds it from Ray instead
of from threads here.  A task is ``judge_on_worker``: it receives the submission's bytes (a node of a real
cluster does not share the instructor's disk), saves them under the file's own name in a folder of its node,
and judges that copy with ``grade_one``, the function a local grade runs, with the same seed, profile and time
limits; the row and its messages name the instructor's file.

The kit's own code is not shipped with the tasks (no ``runtime_env``): Ray puts the driver's script folder
(judge.py's, the kit's root) on its workers' ``sys.path``, so on this machine they import the kit the judge
runs, and every other node needs it installed at that same path, with torch, which a ``working_dir`` upload
could not bring anyway.  The tests a task runs (practice/, ``--tests``, ``--add-tests``) are read on its node,
so a hidden test set needs the same path on every node too.

``ADDRESS`` goes to ``ray.init`` as it is: ``auto`` is the cluster this machine is a node of (RAY_ADDRESS, else
the one ``ray start`` started here), ``HOST:PORT`` a cluster's head, and ``local`` a cluster started in this
process for the length of the grade.

What one task asks of its node (``task_options``): a CPU per rank of the problem's largest world (every rank is
a process), no more than the largest node has, and a GPU per rank when the ranks run on NCCL.  A task whose
worker dies (its node went down, Ray's memory monitor ended it) is retried once, on any node; a second death is
a row with status "lost".  An exception in the kit is not retried: it is a row with status "error".

A Ctrl-C or SIGTERM cancels every task not finished; a running one gets a KeyboardInterrupt, which ends its
test process.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import socket
import tempfile
from pathlib import Path

from .catalogue import Problem
from .config import KitConfig
from .grade import unjudged_row
from .judging import UsageError
from .selfcheck import first_line

try:
    import ray
    from ray.exceptions import (LocalRayletDiedError, NodeDiedError, ObjectLostError, OutOfMemoryError, RayError,
                                RayTaskError, TaskCancelledError, WorkerCrashedError)
    # a task whose worker died, on its retry too: the node, not the student, is why there is no score
    LOST = (WorkerCrashedError, NodeDiedError, LocalRayletDiedError, ObjectLostError, OutOfMemoryError)
except ImportError:   # Ray is an optional extra: RayJudges says how to install it
    ray = None

NEEDS_RAY = "--ray needs Ray: pip install -e '.[ray]'"
CANCEL_GRACE = 10.0   # seconds for the cancelled tasks to end their test processes and say so


class RayJudges:
    """The judges as Ray tasks on the cluster at ``address``: what ``grade`` runs with ``ray=address``."""

    def __init__(self, address: str, problem: Problem, config: KitConfig):
        if ray is None:
            raise UsageError(NEEDS_RAY)
        _check_reachable(address)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # a judge's output is in its row; the workers' own lines would only interleave with grade's
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, ValueError) as e:
            raise UsageError(f"--ray {address}: {first_line(str(e))}") from None
        finally:   # Ray's core worker takes SIGTERM over: a SIGTERM must still stop grade as a Ctrl-C does
            for number, handler in handlers.items():
                if handler is not None:
                    signal.signal(number, handler)
        try:
            self.options, self.config = task_options(problem, config, [n for n in ray.nodes() if n["Alive"]])
        except UsageError:
            ray.shutdown()
            raise
        self.pending = {}   # task -> (student, file), until its row is read

    def rows(self, judge, submissions: list, progress=None):
        """Each student's row, as its task finishes.  A judge's progress events stay on its node, so the bar
        counts a student's tests at once, when the row arrives."""
        task = ray.remote(judge_on_worker).options(**self.options, max_retries=1, retry_exceptions=False)
        judge = functools.partial(judge, config=self.config)   # with the backend settled for the cluster
        for student, file in submissions:
            self.pending[task.remote(judge, student, file, Path(file).read_bytes())] = student, file
        while self.pending:
            # a second at a time, so that a Ctrl-C is seen between waits
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=1.0)
            for ref in ready:
                row = self._row(ref, *self.pending.pop(ref))
                if progress:
                    progress(row["student"], {"event": "collected", "count": len(row["tests"])})
                yield row

    def stop(self) -> list:
        """Cancel every task not finished: the rows of those that finished meanwhile."""
        if not self.pending:
            return []
        for ref in self.pending:
            ray.cancel(ref)
        ended, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=CANCEL_GRACE)
        return [self._row(ref, *self.pending[ref]) for ref in ended]

    def close(self):
        ray.shutdown()   # this grade's connection; the cluster stays (unless --ray local started it)

    @staticmethod
    def _row(ref, student: str, file: str) -> dict:
        try:
            return ray.get(ref)
        except TaskCancelledError:
            return unjudged_row(student, file, "interrupted")
        except LOST as e:
            return unjudged_row(student, file, "lost", f"{type(e).__name__}: {first_line(str(e))}")
        except RayError as e:
            cause = e.cause if isinstance(e, RayTaskError) else e
            return unjudged_row(student, file, "error", f"the Ray task failed: {type(cause).__name__}: "
                                                        f"{first_line(str(cause))}")


def judge_on_worker(judge, student: str, file: str, source: bytes) -> dict:
    """On a Ray worker: the submission ``source``, saved as ``file``'s name in a folder of this node, judged."""
    with tempfile.TemporaryDirectory(prefix="kit-ray-") as folder:
        copy = os.path.join(folder, os.path.basename(file))
        Path(copy).write_bytes(source)
        return judge(student, copy, shown_as=file)


def task_options(problem: Problem, config: KitConfig, nodes: list) -> tuple[dict, KitConfig]:
    """(what each task asks of its node, the configuration it judges with).

    A task sees every GPU of its node unless it asks for some, so ``--backend auto`` is settled here: NCCL with
    a GPU per rank where one node has them for the largest world, else gloo."""
    world = problem.max_world_size

    def largest(resource: str) -> float:
        return max((n["Resources"].get(resource, 0) for n in nodes), default=0)

    backend = config.backend
    if backend == "auto":
        backend = "nccl" if largest("GPU") >= world else "gloo"
    if backend == "nccl" and largest("GPU") < world:
        raise UsageError(f"--backend nccl needs one GPU per rank on one node: problem {problem.number}'s tests "
                         f"start worlds of up to {world} ranks, and the Ray cluster's largest node has "
                         f"{largest('GPU'):g} GPUs. Use --backend gloo (CPU) or auto")
    options = {"num_cpus": min(world, largest("CPU")) or 1, "num_gpus": world if backend == "nccl" else 0}
    return options, dataclasses.replace(config, backend=backend)


def _check_reachable(address: str):
    """Ray waits many minutes for a head that is not there: a HOST:PORT that takes no connection is a usage
    error now.  ``auto`` and ``local`` are Ray's to find or start."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise UsageError(f"--ray {address}: no Ray cluster answers there ({e.strerror or e}). Start one with "
                         "'ray start --head' and give the address it prints") from None
