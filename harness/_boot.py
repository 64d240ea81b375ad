"""Start the torch-preloaded forkserver as early as possible, before the caller imports torch.

Preloading torch, torch.distributed and torch._dynamo takes seconds; started
first, it overlaps with the test process's own imports and collection.
"""
import multiprocessing as mp
from multiprocessing import forkserver

CONTEXT = mp.get_context("forkserver")
CONTEXT.set_forkserver_preload(["harness._rank"])


def start_forkserver():
    forkserver.ensure_running()
