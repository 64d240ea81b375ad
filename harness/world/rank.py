"""The loop each rank process runs: receive a task, run it traced, send back the result.

This module is preloaded by the forkserver, so importing torch, torch.distributed
and the optimizers' lazy torch._dynamo happens once, not once per rank.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import resource
import signal
import sys
import traceback
import warnings
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist
import torch._dynamo  # noqa: F401  (first optimizer construction imports it lazily: ~2 s per rank)

from .. import _torch
from ..record.integrity import integrity_snapshot   # (imports harness.memory: its accessors are bound before learner code)
from ..record.kernels import install
from .diagnose import ENGINE_DIR, short_path
from ..probes.files import mode_for
from ..sandbox import confine, guard_store, hint
from ..sandbox.notify import hand_over
from ..devices import device, made_without_a_device_land_on, on_rank_device
from ..errors import ForbiddenOp, TraceTampered
from ..held import release_held
from .setup import RankSetup
from .wire import TOKEN_BYTES, Reply, WireError

# Process groups that calls created and never destroyed, before the world is replaced: each one
# holds sockets and threads in every member (about 5 fds and 3 threads per call at N=2).
_MAX_GROUPS = 32
_LIBRARY_DIRS = (os.path.dirname(torch.__file__), ENGINE_DIR, os.path.dirname(os.__file__))


def _die_with_parent():
    """Ask Linux to SIGKILL this rank when the forkserver (our parent) dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _blank_inherited_fds(keep: set):
    """Point every descriptor the rank inherited and does not need at /dev/null: the forkserver's
    resource tracker and liveness pipes lead to unconfined processes.  (Closing them instead would let
    a later socket take their numbers, and a library that still writes to them would write there.)"""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd != null:
            try:
                os.dup2(null, fd)
            except OSError:
                pass   # the listing's own descriptor, closed by now
    os.close(null)


def _cap_allocations(memory_gb: float | None):
    """The kernel refuses an allocation that takes the rank past ``memory_gb`` more than it holds now
    (RLIMIT_DATA: its heap and private writable mappings), whatever the machine's load: a runaway
    allocation fails at once with MemoryError (or torch's "can't allocate memory").  Address ranges
    reserved without access (CUDA's) do not count.  The test process's watch of resident memory stays."""
    if not memory_gb:
        return
    with open("/proc/self/status") as f:
        data_kb = next(int(line.split()[1]) for line in f if line.startswith("VmData:"))
    limit = data_kb * 1024 + int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


_M_MMAP_THRESHOLD = -3   # glibc's mallopt parameter
_OWN_PAGES_FROM = 1 << 20


def _give_back_large_frees():
    """Allocations of 1 MiB and more get pages of their own (mmap) and return them when freed, so the
    rank's resident memory, which the test process reads (``probes.memory``), follows what it holds.
    glibc would otherwise raise this threshold each time such a block is freed, and keep the pages of
    later ones in its heap after they are freed.  A C library without mallopt keeps its own policy."""
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _OWN_PAGES_FROM)
    except (OSError, AttributeError):
        pass


def _user_frames(tb) -> list:
    frames = []
    for fs in traceback.extract_tb(tb):
        if fs.filename.startswith(_LIBRARY_DIRS) or "site-packages" in fs.filename:
            continue
        frames.append((short_path(fs.filename), fs.lineno, fs.name, (fs.line or "").strip()))
    return frames


def _quiet_renamed_collectives():
    """torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (``*_single``) and warns on the
    old names; the kit keeps the old ones because they exist on every torch it supports."""
    warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*",
                            category=FutureWarning)


def gloo_environment(platform: str) -> dict:
    """The variables a rank sets for gloo on ``platform``.  On macOS gloo looks for its interface through
    the host's name, which often resolves to no address of this machine, and the group never forms
    ("Unable to find address for ..."); every rank of a world runs on this machine, so loopback is right."""
    return {"GLOO_SOCKET_IFNAME": "lo0"} if platform == "darwin" else {}


def rank_main(setup: RankSetup, conn, record_conn):
    # stderr first: whatever goes wrong from here on is shown in the RankCrashed message
    stderr_fd = os.open(setup.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(stderr_fd, 2)
    os.dup2(stderr_fd, 1)   # a stdout shared by every rank would be a channel between them
    os.close(stderr_fd)
    _die_with_parent()
    _quiet_renamed_collectives()
    stack_file = open(setup.stack, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    _blank_inherited_fds(keep={1, 2, conn.fileno(), record_conn.fileno(), stack_file.fileno()})
    torch.set_num_threads(1)
    backend, rank, world_size = setup.backend, setup.rank, setup.world_size
    if backend == "nccl":
        torch.cuda.set_device(rank)
        # Tolerances are the CPU's: no TF32 in matmuls or convolutions, so float32 keeps its 24 bits on a GPU
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    store = dist.FileStore(setup.store, world_size)
    # Confined before gloo starts its threads: Landlock covers only the threads created after it.
    protections = confine(setup.tmp, store_file=setup.store, gpu=backend == "nccl",
                          writable=[setup.shared] if setup.shared else (), hidden=setup.sandbox.hidden,
                          landlock=setup.sandbox.landlock, ids=setup.ids, ids_note=setup.ids_note)
    # The file witness's filter, after confine (its checks read this rank's own identity) and before any
    # code under test; the first message on the pipe, even when there is none (see probes.files).
    hand_over(conn.fileno(), mode_for(protections["landlock"].startswith("ABI"), setup.shared is not None))
    # (what it could not do, it says to the test process)
    _cap_allocations(setup.sandbox.memory_gb)
    _give_back_large_frees()
    # set over a user's own value too: the engine reads no environment, and loopback reaches every peer
    for name, value in gloo_environment(sys.platform).items():
        os.environ[name] = value
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=600))
    guard_store()   # the store's file stays writable for gloo; rank code may not use it
    recorder = install(rank, record_conn.fileno(), setup.shared)   # records stream to the test process as issued
    verify_tracer = integrity_snapshot()  # taken before any learner code runs
    world_group = dist.group.WORLD
    conn.send_bytes(json.dumps({"ready": protections}).encode())   # said before any code under test runs
    functions = {}
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if payload == b"stop":
            break
        reply = _run_task(payload, functions, recorder, verify_tracer)
        if not dist.is_initialized() or dist.group.WORLD is not world_group:
            # Tutorial-style cleanup (destroy_process_group) would break every later call on this
            # world: fail this call in plain words, and the pool replaces the world.
            cause = "" if reply.status == "ok" else f" (it then raised {reply.error[0]}: {reply.error[1]})"
            reply.status, reply.retire, reply.error = "broken", True, (
                "RuntimeError", "the code destroyed or replaced the default process group"
                f"{cause}; the harness creates it and owns it: do not call init_process_group "
                "or destroy_process_group in code run by harness.run", [])
        elif len(_torch.process_groups()) > _MAX_GROUPS:
            reply.retire = True   # calls left groups behind: retire this world rather than let them pile up
        try:
            data = reply.encode()
        except WireError as exc:  # a return value that is not plain data
            problem = str(exc).replace("reply['value']", "the return value", 1)
            reply.status, reply.value, reply.error = "error", None, (
                "TypeError", f"the rank function's return value cannot be sent back: {problem}", [])
            data = reply.encode()
        conn.send_bytes(data)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    sys.stderr.flush()
    os._exit(0)


def _run_task(payload: bytes, functions: dict, recorder, verify_tracer) -> Reply:
    """Run one call; the reply is plain data (see ``wire``): status, value or error, and the op count."""
    reply = Reply()
    try:
        reply.token = payload[:TOKEN_BYTES]
        try:
            fn_key, fn_bytes, args, kwargs, policy = cloudpickle.loads(payload[TOKEN_BYTES:])
        except Exception as e:
            raise TypeError(f"the rank cannot load the arguments of this call ({type(e).__name__}: {e}): an "
                            "argument of harness.run may name a function or class by a module the ranks cannot "
                            "import (a test file's own); pass the rank function's own code, or data") from None
        if fn_bytes is not None:
            functions[fn_key] = cloudpickle.loads(fn_bytes)
        release_held()
        recorder.reset(policy)
        here = device()
        args, kwargs = on_rank_device(args, here), on_rank_device(kwargs, here)
        for part in policy.rank_parts:
            part.enter(recorder)
        returned = False
        try:
            with made_without_a_device_land_on(policy.default_device):
                reply.value = functions[fn_key](*args, **kwargs)
            returned = True
        finally:
            reply.probes = {part.name: part.exit() for part in reversed(policy.rank_parts)}
            recorder.finish(reply.value, returned)
        if recorder.policy.refused:  # a ForbiddenOp that the code caught and swallowed
            raise ForbiddenOp(recorder.policy.refused)
        verify_tracer()
        recorder.check_untampered()
    except BaseException as exc:  # noqa: BLE001 -- everything goes back to the test process
        if recorder.policy.refused and not isinstance(exc, (ForbiddenOp, TraceTampered)):
            exc = ForbiddenOp(recorder.policy.refused)  # the refusal is the root cause, however it surfaced
        reply.value = None
        reply.error = (type(exc).__name__, str(exc) + hint(exc), _user_frames(exc.__traceback__))
        reply.status = ("forbidden" if isinstance(exc, ForbiddenOp) else
                        "tampered" if isinstance(exc, TraceTampered) else "error")
    reply.ops_traced, reply.ops_digest = len(recorder.ops), recorder.digest()
    return reply
