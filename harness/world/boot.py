"""The torch-preloaded forkserver, and the rank processes forked from it.

Preloading torch, torch.distributed and torch._dynamo takes seconds; started first (``prestart``),
it overlaps with the test process's own imports and collection.  ``RankProcess`` starts one rank
from it, running ``_rank.rank_main`` without re-running the caller's main module.
"""
import multiprocessing as mp
from multiprocessing import forkserver, popen_forkserver, spawn

CONTEXT = mp.get_context("forkserver")
# the forkserver confines itself before anything else (sandbox.forkserver), then preloads torch
CONTEXT.set_forkserver_preload(["harness.sandbox.forkserver", "harness.world.rank"])


def prestart():
    """Start the forkserver now (it imports torch), so the first ``harness.run`` does not wait for it."""
    forkserver.ensure_running()



class _Popen(popen_forkserver.Popen):
    """Forkserver launch that does not re-run the caller's main module in each rank.

    Plain multiprocessing re-imports ``__main__`` in the child (spawn semantics),
    which would re-run judge.py, pytest or a learner's script in every rank.
    """

    def _launch(self, process_obj):
        real = spawn.get_preparation_data

        def without_main(name):
            data = real(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data = real


class RankProcess(CONTEXT.Process):
    """One rank: ``RankProcess(args=(setup.RankSetup, conn, record_conn))``."""

    def __init__(self, args: tuple, name: str):
        super().__init__(target=_rank_entry, args=args, daemon=True, name=name)

    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


def _rank_entry(*args):
    from .rank import rank_main
    rank_main(*args)
