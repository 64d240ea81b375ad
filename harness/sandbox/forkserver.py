"""The forkserver confines itself first, before it preloads torch or forks a rank.

Imported as the first of the forkserver's preload modules (``world.boot``), so it runs in the forkserver
process before anything else is imported there.  Every rank is forked from this process and inherits
what it sets:

* the seccomp filter's IPC and ESCAPE rules (``seccomp``): no ptrace or process_vm access to any process,
  no new session or process group, no namespaces or mounts.  (Unix sockets and the locked prctls stay:
  an NCCL rank needs the one, and each rank sets PR_SET_PDEATHSIG and PR_SET_DUMPABLE itself);
* PR_SET_DUMPABLE 0: a process of the same uid cannot read the forkserver's memory or its /proc entries
  (each rank makes itself dumpable again, for the test process's witnesses).

No rank can reach the forkserver's socket anyway: a gloo rank may not make a Unix socket at all, and a
rank that runs as its own uid may not enter the test process's folder where the socket lives.
"""
import ctypes

from .seccomp import restrict

STATE = restrict(unix_sockets=True, lock_prctl=False) or "on"   # "on", or why not
ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)           # PR_SET_DUMPABLE 0
