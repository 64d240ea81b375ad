"""File events and path rules seen below Python: seccomp user notification (issue 23, item 4).

Each test forks a plain child (no torch): it installs the filter, hands its listener fd to this
process over a socketpair, then makes file calls -- through Python, ``dir_fd``, pathlib, ctypes
straight into libc, a thread, a child of its own -- while this process supervises.  Mode "events"
counts the write events under a folder and kills at the n-th before it runs; mode "enforce" (the
fallback where the kernel has no Landlock) refuses reading hidden paths and writing outside the
writable roots.
"""
import ctypes
import dataclasses
import errno
import multiprocessing.connection
import os
import pathlib
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from harness.sandbox import _notify_filter, notify

pytestmark = pytest.mark.skipif(notify.unavailable_reason() is not None,
                                reason=f"no seccomp user notification here: {notify.unavailable_reason()}")
LIBC = ctypes.CDLL(None, use_errno=True)
TIMEOUT = 30


def supervised(child, rules: notify.Rules, kill_the_child: bool = False):
    """Run ``child()`` in a forked process under the filter while this process supervises it.

    Returns (how the child ended: "exit 0" or "SIGKILL", what ``child`` returned, the supervisor).
    ``kill_the_child``: the rules' kill_at names the child's pid (known once it is forked)."""
    ours, theirs = socket.socketpair()
    results_r, results_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: nothing of pytest's below this line
        try:
            ours.close()
            os.close(results_r)
            sys.dont_write_bytecode = True          # a first import would write a .pyc: a write event
            why = notify.hand_over(theirs.fileno(), rules.mode)
            outcome = ("unavailable", why) if why else ("returned", child())
        except BaseException as e:                 # noqa: BLE001 -- reported to the test process
            outcome = ("raised", f"{type(e).__name__}: {e}")
        os.write(results_w, pickle.dumps(outcome))
        os._exit(0)
    theirs.close()
    os.close(results_w)
    fd, text = notify.recv_fd(ours.fileno())
    ours.close()
    assert isinstance(fd, int), f"the child could not install the filter: {text}"
    if kill_the_child:
        rules = dataclasses.replace(rules, kill_at=(rules.kill_at[0], pid))
    supervisor = notify.Supervisor(fd, rules)
    status, deadline = None, time.monotonic() + TIMEOUT
    while not supervisor.done:
        multiprocessing.connection.wait([supervisor], timeout=0.05)
        supervisor.handle_ready()
        if status is None:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            status = status if reaped else None
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError("the supervised child did not finish")
    supervisor.close()
    if status is None:
        status = os.waitpid(pid, 0)[1]           # the filter is let go at exit, before the reaping
    with os.fdopen(results_r, "rb") as f:
        data = f.read()
    ended = f"exit {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else signal.Signals(os.WTERMSIG(status)).name
    outcome = pickle.loads(data) if data else ("nothing", None)
    return ended, outcome, supervisor


def returned(child, rules, **kwargs):
    """What ``child`` returned under ``rules`` (it must exit normally), and the supervisor."""
    ended, (how, value), supervisor = supervised(child, rules, **kwargs)
    assert (ended, how) == ("exit 0", "returned"), f"the child ended with {ended}, {how}: {value}"
    return value, supervisor


def counted(supervisor) -> list:
    return [(e.what, os.path.basename(e.path)) for e in supervisor.events]


def refused(fn, *args) -> str:
    """'refused' when fn(*args) fails with EACCES (PermissionError), else what it did."""
    try:
        fn(*args)
    except PermissionError:
        return "refused"
    except OSError as e:
        return f"failed: {e}"
    return "allowed"


# ---- mode "events": counting write events under a folder -------------------------------------------

def test_every_route_to_a_write_event_under_the_folder_is_counted(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (ckpt / ("long" * 60)).write_text("")

    def child():
        with open(ckpt / "a.tmp", "w") as f:                                       # open
            f.write("a")
        folder = os.open(ckpt, os.O_RDONLY | os.O_DIRECTORY)                       # a read: not an event
        with os.fdopen(os.open("b", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder), "w") as f:   # dir_fd
            f.write("b")
        os.close(folder)
        (ckpt / "c").write_text("c")                                               # pathlib
        os.replace(ckpt / "a.tmp", ckpt / "a")                                     # rename, by destination
        os.remove(ckpt / "b")
        os.mkdir(ckpt / "sub")
        os.rmdir(ckpt / "sub")
        fd = LIBC.open(os.fsencode(ckpt / "d"), os.O_WRONLY | os.O_CREAT, 0o644)   # ctypes, below Python
        os.close(fd)
        LIBC.rename(os.fsencode(ckpt / "d"), os.fsencode(ckpt / "e"))
        how = struct.pack("=QQQ", os.O_WRONLY | os.O_CREAT, 0o644, 0)              # openat2: flags in memory
        os.close(LIBC.syscall(437, -100, os.fsencode(ckpt / "f"), how, len(how)))
        os.remove(ckpt / "f")
        os.remove(ckpt / ("long" * 60))                                            # a path over 256 bytes
        (ckpt / "c").read_text()                                                   # a read: not an event
        (tmp_path / "elsewhere" / "x").write_text("x")                             # outside the folder
        return sorted(os.listdir(ckpt))

    listing, supervisor = returned(child, notify.Rules(count_under=str(ckpt)))
    assert listing == ["a", "c", "e"]
    assert counted(supervisor) == [("open for writing", "a.tmp"), ("open for writing", "b"),
                                   ("open for writing", "c"), ("rename to", "a"), ("remove", "b"),
                                   ("mkdir", "sub"), ("rmdir", "sub"), ("open for writing", "d"),
                                   ("rename to", "e"), ("open for writing", "f"), ("remove", "f"),
                                   ("remove", "long" * 60)]
    assert supervisor.describe(supervisor.events[0]) == "open for writing ckpt/a.tmp"


def _three_saves(ckpt):
    def child():
        for name in ("one", "two", "three"):
            (ckpt / name).write_text(name)
        return "all three written"
    return child


def test_the_kill_comes_before_the_nth_event_runs(tmp_path):
    ended, outcome, supervisor = supervised(_three_saves(tmp_path), notify.Rules(count_under=str(tmp_path),
                                                                                   kill_at=(2, None)))
    assert ended == "SIGKILL" and outcome == ("nothing", None)
    assert sorted(os.listdir(tmp_path)) == ["one"], "the second open for writing never ran"
    assert supervisor.describe(supervisor.killed) == f"open for writing {tmp_path.name}/two"
    assert len(supervisor.events) == 2


def test_a_kill_before_a_rename_leaves_the_temporary_file(tmp_path):
    def child():
        LIBC.rename(os.fsencode(tmp_path / "part.tmp"), os.fsencode(tmp_path / "part.pt"))   # ctypes
        return "renamed"

    (tmp_path / "part.tmp").write_text("state")
    ended, _, supervisor = supervised(child, notify.Rules(count_under=str(tmp_path), kill_at=(1, None)))
    assert ended == "SIGKILL" and sorted(os.listdir(tmp_path)) == ["part.tmp"]
    assert supervisor.killed.what == "rename to"


def test_kill_after_write_leaves_the_file_as_written_so_far(tmp_path):
    def child():
        with open(tmp_path / "part.tmp", "w") as f:    # event 1: runs
            f.write("first half")
            f.flush()
            os.replace(tmp_path / "part.tmp", tmp_path / "part.pt")     # the next routed call: killed here
        return "saved"

    ended, _, supervisor = supervised(child, notify.Rules(count_under=str(tmp_path), kill_at=(1, None),
                                                          kill_after_write=True))
    assert ended == "SIGKILL"
    assert sorted(os.listdir(tmp_path)) == ["part.tmp"] and (tmp_path / "part.tmp").read_text() == "first half"
    assert supervisor.killed.what == "open for writing"


def test_a_kill_that_never_comes_leaves_the_child_alone(tmp_path):
    value, supervisor = returned(_three_saves(tmp_path), notify.Rules(count_under=str(tmp_path), kill_at=(9, None)))
    assert value == "all three written" and supervisor.killed is None and len(supervisor.events) == 3


def test_an_event_in_a_grandchild_kills_the_named_process_and_the_caller(tmp_path):
    def child():
        writer = os.fork()
        if writer == 0:
            (tmp_path / "from_grandchild").write_text("x")
            os._exit(0)
        os.waitpid(writer, 0)
        return "the grandchild wrote"

    ended, _, supervisor = supervised(child, notify.Rules(count_under=str(tmp_path), kill_at=(1, None)),
                                      kill_the_child=True)
    assert ended == "SIGKILL" and os.listdir(tmp_path) == []
    assert supervisor.killed.what == "open for writing"


def test_new_rules_for_the_next_call_count_from_one_again(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        notify.hand_over(theirs.fileno(), "events")
        (first / "one").write_text("1")
        theirs.recv(1)                                     # the test process has new rules
        (second / "two").write_text("2")
        (second / "three").write_text("3")
        os._exit(0)
    theirs.close()
    supervisor = notify.Supervisor(notify.recv_fd(ours.fileno())[0], notify.Rules(count_under=str(first)))
    while not supervisor.events:
        multiprocessing.connection.wait([supervisor], timeout=TIMEOUT)
        supervisor.handle_ready()
    supervisor.reset(notify.Rules(count_under=str(second), kill_at=(2, None)))
    ours.send(b"!")
    while supervisor.handle_ready():
        multiprocessing.connection.wait([supervisor], timeout=TIMEOUT)
    assert os.waitpid(pid, 0)[1] == signal.SIGKILL and os.listdir(second) == ["two"]
    assert counted(supervisor) == [("open for writing", "two"), ("open for writing", "three")]
    supervisor.close()


def test_an_event_in_a_thread_started_later_kills_the_whole_process(tmp_path):
    def child():
        writer = threading.Thread(target=(tmp_path / "from_thread").write_text, args=("x",))
        writer.start()
        writer.join()
        return "the thread wrote"

    ended, _, supervisor = supervised(child, notify.Rules(count_under=str(tmp_path), kill_at=(1, None)))
    assert ended == "SIGKILL" and os.listdir(tmp_path) == []
    assert supervisor.describe(supervisor.killed) == f"open for writing {tmp_path.name}/from_thread"


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def test_the_rank_keeps_no_listener_and_reads_cost_nothing_in_mode_events(tmp_path):
    def child():
        fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}")]        # not the listing's own fd, closed since
        for _ in range(200):
            os.close(os.open("/dev/null", os.O_RDONLY))
        return fds

    inherited = [fd for fd in os.listdir("/proc/self/fd") if "seccomp" in _link(f"/proc/self/fd/{fd}")]
    fds, supervisor = returned(child, notify.Rules(count_under=str(tmp_path)))
    # (this test process may hold the listeners of its worlds' ranks: a forked child inherits those)
    assert sum("seccomp" in target for target in fds) <= len(inherited), fds
    assert supervisor.handled == 0, "a read-only open reached the supervisor in mode events"


# ---- mode "enforce": the no-Landlock fallback ------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    """tmp/hidden/secret, tmp/public/readme (readable), tmp/private (writable)."""
    for folder in ("hidden", "public", "private"):
        (tmp_path / folder).mkdir()
    (tmp_path / "hidden" / "secret").write_text("the reference solution")
    (tmp_path / "public" / "readme").write_text("the statement")
    rules = notify.Rules(mode="enforce", hidden=(str(tmp_path / "hidden"),),
                         writable=(str(tmp_path / "private"), "/dev/null"))
    return tmp_path, rules


def test_hidden_files_cannot_be_read(tree):
    root, rules = tree

    tool = root / "hidden" / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o755)

    def child():
        return {"open": refused(open, root / "hidden" / "secret"),
                "exec": refused(subprocess.run, [str(tool)]),
                "listdir": refused(os.listdir, root / "hidden"),
                "ctypes open": "refused" if LIBC.open(os.fsencode(root / "hidden" / "secret"), 0) < 0
                and ctypes.get_errno() == errno.EACCES else "allowed",
                "public": (root / "public" / "readme").read_text()}

    value, supervisor = returned(child, rules)
    assert value == {"open": "refused", "exec": "refused", "listdir": "refused", "ctypes open": "refused",
                     "public": "the statement"}
    assert [(e.what, os.path.basename(e.path)) for e in supervisor.denied] == [
        ("open for reading", "secret"), ("exec", "tool"), ("open for reading", "hidden"),
        ("open for reading", "secret")]


def test_writes_outside_the_writable_roots_are_refused(tree):
    root, rules = tree
    public, private = root / "public", root / "private"

    def child():
        (private / "mine").write_text("mine")
        return {"create": refused(open, public / "new", "w"),
                "overwrite": refused((public / "readme").write_text, "overwritten"),
                "rename out": refused(os.rename, private / "mine", public / "mine"),
                "rename in": refused(os.rename, public / "readme", private / "readme"),
                "mkdir": refused(os.mkdir, public / "d"),
                "remove": refused(os.remove, public / "readme"),
                "hard link in": refused(os.link, public / "readme", private / "alias"),
                "symlink": refused(os.symlink, "/etc", public / "etc"),
                "truncate": refused(os.truncate, public / "readme", 0),
                "/dev/null": refused(open, "/dev/null", "w")}

    value, _ = returned(child, rules)
    assert value == {"create": "refused", "overwrite": "refused", "rename out": "refused",
                     "rename in": "refused", "mkdir": "refused", "remove": "refused", "hard link in": "refused",
                     "symlink": "refused", "truncate": "refused", "/dev/null": "allowed"}
    assert sorted(os.listdir(public)) == ["readme"] and (public / "readme").read_text() == "the statement"
    assert sorted(os.listdir(private)) == ["mine"]


def test_writes_inside_the_writable_roots_work_as_usual(tree):
    root, rules = tree
    private = root / "private"

    def child():
        os.umask(0o077)
        (private / "a.tmp").write_text("hello")
        os.replace(private / "a.tmp", private / "a")
        os.mkdir(private / "d")
        with os.fdopen(os.open("b", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=os.open(
                private / "d", os.O_RDONLY | os.O_DIRECTORY)), "w") as f:
            f.write("in d")
        os.symlink("a", private / "link")
        os.link(private / "a", private / "hard")
        os.truncate(private / "hard", 2)
        with open(private / "a", "a") as f:
            f.write("!")
        os.remove(private / "hard")
        return {name: (private / name).read_text() for name in ("a", "link", "d/b")}

    value, supervisor = returned(child, rules)
    assert value == {"a": "he!", "link": "he!", "d/b": "in d"}
    assert sorted(os.listdir(private)) == ["a", "d", "link"] and os.readlink(private / "link") == "a"
    assert oct((private / "d" / "b").stat().st_mode & 0o777) == oct(0o600), "the child's umask applies"
    assert supervisor.denied == []


def test_relative_paths_resolve_from_the_callers_folder(tree):
    root, rules = tree

    def child():
        os.chdir(root / "hidden")
        hidden = refused(open, "secret")
        os.chdir(root / "private")
        (pathlib.Path("rel")).write_text("relative")
        return {"hidden": hidden, "escape": refused(open, "../public/new", "w"),
                "proc self": refused(open, f"/proc/self/cwd/rel")}

    value, _ = returned(child, rules)
    assert value == {"hidden": "refused", "escape": "refused", "proc self": "allowed"}
    assert (root / "private" / "rel").read_text() == "relative"


def test_what_a_process_holds_is_reopened_through_proc_by_the_rules_of_its_path(tree):
    root, rules = tree
    parent = os.getpid()

    def child():
        r, w = os.pipe()
        with open(f"/proc/self/fd/{w}", "w") as again:    # a pipe: it never had a path
            again.write("through /proc")
        os.close(w)
        scratch = root / "private" / "scratch"
        held = os.open(scratch, os.O_RDWR | os.O_CREAT, 0o600)
        os.remove(scratch)                                 # "<private>/scratch (deleted)": judged as in private
        memfd = os.memfd_create("anonymous")               # "/memfd:anonymous (deleted)": outside the roots
        return {"pipe": os.read(r, 100).decode(), "deleted file": refused(open, f"/proc/self/fd/{held}", "w"),
                "memfd": refused(open, f"/proc/self/fd/{memfd}", "w"),
                "another process": refused(open, f"/proc/{parent}/status")}

    value, _ = returned(child, rules)
    assert value == {"pipe": "through /proc", "deleted file": "allowed", "memfd": "refused",
                     "another process": "refused"}


def test_symlinks_into_a_hidden_folder_are_refused(tree):
    root, rules = tree
    private = root / "private"

    def child():
        os.symlink(root / "hidden" / "secret", private / "to_secret")
        os.symlink(root / "hidden", private / "to_hidden")
        os.symlink("../hidden/secret", private / "relative")
        return [refused(open, private / name) for name in ("to_secret", "to_hidden/secret", "relative")]

    value, _ = returned(child, rules)
    assert value == ["refused"] * 3


def test_a_child_process_of_the_child_is_supervised_too(tree):
    root, rules = tree

    def child():
        script = ("import sys\nfor path, mode in zip(sys.argv[1::2], sys.argv[2::2]):\n"
                  "    try:\n        open(path, mode)\n        print('allowed')\n"
                  "    except PermissionError:\n        print('refused')\n")
        out = subprocess.run([sys.executable, "-c", script, str(root / "hidden" / "secret"), "r",
                              str(root / "public" / "new"), "w", str(root / "private" / "new"), "w"],
                             capture_output=True, text=True, timeout=TIMEOUT)
        return out.stdout.split(), out.stderr[-500:]

    (lines, stderr), supervisor = returned(child, rules)
    assert lines == ["refused", "refused", "allowed"], stderr
    assert not (root / "public" / "new").exists() and (root / "private" / "new").exists()


def test_a_path_rewritten_by_another_thread_mid_call_never_opens_the_hidden_file(tree):
    """The TOCTOU that CONTINUE would leave: the supervisor carries the open out on its own copy."""
    root, rules = tree
    allowed, hidden = os.fsencode(root / "public" / "readme"), os.fsencode(root / "hidden" / "secret")

    def child():
        size = max(len(allowed), len(hidden)) + 1
        path = ctypes.create_string_buffer(size)
        stop = threading.Event()

        def flip():
            while not stop.is_set():
                for value in (allowed, hidden):
                    ctypes.memmove(path, value + b"\0", len(value) + 1)

        flipper = threading.Thread(target=flip)
        flipper.start()
        seen = {"readme": 0, "secret": 0, "refused": 0}
        for _ in range(400):
            fd = LIBC.open(path, os.O_RDONLY)
            if fd < 0:
                seen["refused"] += 1
                continue
            seen["secret" if os.read(fd, 100).startswith(b"the reference") else "readme"] += 1
            os.close(fd)
        stop.set()
        flipper.join()
        return seen

    seen, _ = returned(child, rules)
    assert seen["secret"] == 0, seen
    assert seen["readme"] and seen["refused"], f"the race never happened: {seen}"


def test_io_uring_is_denied(tmp_path):
    def child():
        params = ctypes.create_string_buffer(120)
        rc = LIBC.syscall(425, 4, params)
        return rc, ctypes.get_errno()

    value, _ = returned(child, notify.Rules(count_under=str(tmp_path)))
    assert value == (-1, errno.EPERM)


# ---- costs ---------------------------------------------------------------------------------------------

def _microseconds_per_open(flags: int, n: int = 2000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        os.close(os.open("/dev/null", flags))
    return (time.perf_counter() - start) / n * 1e6


def test_what_a_routed_open_costs(tmp_path):
    """Microseconds per open of /dev/null, printed (run with -s); asserted only where it must be zero."""
    def child():
        return {"read, mode events": _microseconds_per_open(os.O_RDONLY),
                "write, mode events (routed)": _microseconds_per_open(os.O_WRONLY)}

    def enforced():
        return {"read, mode enforce (routed, fd injected)": _microseconds_per_open(os.O_RDONLY)}

    before = {"read, no filter": _microseconds_per_open(os.O_RDONLY)}
    events, supervisor = returned(child, notify.Rules(count_under=str(tmp_path)))
    assert supervisor.handled == 2000, "only the 2000 opens for writing reach the supervisor"
    enforce, _ = returned(enforced, notify.Rules(mode="enforce", writable=("/dev/null",)))
    costs = {**before, **events, **enforce}
    print("\n" + "\n".join(f"  {name:42s} {us:7.1f} us per open" for name, us in costs.items()))


@pytest.mark.parametrize("kill_at", [(0, None), (1, 0), (1, -1), (1, os.getpid()), (1,), (True, None)])
def test_a_kill_that_could_hit_a_process_group_or_the_supervisor_is_refused(kill_at):
    with pytest.raises(ValueError, match="kill_at"):
        notify.Rules(kill_at=kill_at)


# ---- the filter itself -----------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize("mode", ["events", "enforce"])
def test_the_program_assembles_for_both_machines(arch, mode):
    code = _notify_filter.program(mode, arch)
    assert len(code) % 8 == 0 and 8 < len(code) // 8 < 100
