"""``python judge.py doctor``: what this machine has for the kit, which problems run here, and the fixes.

It reports:
- the machine: OS, Python, torch and its build (CPU or CUDA), cores, memory, GPUs;
- gloo: torch.distributed and its backends, libuv, the interface the ranks' gloo binds to, and a real
  2-rank all_reduce through the harness (how long it took, and the memory one rank holds);
- the sandbox: each protection's state here (``harness.protections_here()``), what it guards, and
  whether ``--sealed`` can grade here;
- each problem of the catalogue: the largest world its tests start, whether the cores and memory here
  are enough, and its backends (gloo always; NCCL with a GPU per rank);
- each known platform problem that applies here (``KNOWN_PROBLEMS``), with its fix.

The facts are gathered first, as plain data (``Facts``), then rendered.  Exit code: 0 when the kit can
run here (torch.distributed with gloo, and the 2-rank check passed); 1 (``EXIT_FAIL``) when it cannot.
What sealed grading or NCCL lacks is reported, not failed: a learner needs neither.
"""
from __future__ import annotations

import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from .cli import EXIT_FAIL, EXIT_PASS
from .report import console, protections_line

_GB = 2**30
_CHECK_RANKS = 2


@dataclass
class GlooCheck:
    """A real all_reduce on a world of two gloo ranks, started by the harness."""
    ok: bool
    detail: str = ""                # why not, when not ok
    seconds: float = 0.0            # starting the world (and the forkserver) and the all_reduce
    rank_gb: float = 0.0            # the most resident memory a rank held
    interface: str | None = None    # GLOO_SOCKET_IFNAME as the ranks saw it
    protections: dict = field(default_factory=dict)   # what confined the check's ranks


@dataclass
class Facts:
    platform: str = ""              # sys.platform: linux, darwin, win32
    os: str = ""
    python: str = ""
    torch: str | None = None        # None: torch does not import
    cuda: str | None = None         # the CUDA version torch was built for; None: a CPU build
    gpus: tuple = ()                # the names of the GPUs torch can use
    cores: int = 1
    memory_gb: float = 0.0
    available_gb: float | None = None
    distributed: bool = False       # torch.distributed.is_available()
    backends: tuple = ()            # of gloo and nccl, those this torch has
    libuv: str = ""                 # "yes", or "no" and why: TCPStore's libuv backend
    host_address: str = ""          # where gloo binds when no interface is named
    protections: dict = field(default_factory=dict)   # harness.protections_here()
    check: GlooCheck | None = None


@dataclass(frozen=True)
class KnownProblem:
    name: str
    applies: Callable[[Facts], bool]
    problem: str
    fix: str


def _linux_lacks(facts: Facts, measure: str) -> bool:
    return facts.platform.startswith("linux") and any(m.startswith(f"{measure}:")
                                                      for m in facts.protections.get("missing", ()))


def _container_policy(facts: Facts) -> bool:
    return "seccomp policy" in facts.protections.get("landlock", "")


KNOWN_PROBLEMS = (
    KnownProblem(
        "macOS: gloo's interface", lambda f: f.platform == "darwin",
        "gloo finds its interface through the host's name, which on macOS often resolves to no address of "
        "this machine, and the process group never forms (\"Unable to find address for ...\").",
        "the harness sets GLOO_SOCKET_IFNAME=lo0 (the loopback interface) for its own ranks; for your own "
        "scripts (torchrun, mp.spawn) run: export GLOO_SOCKET_IFNAME=lo0. The kit's ranks also use Linux-only "
        "parts (/proc, prctl, the sandbox): where the 2-rank check fails here, run the kit in a Linux VM or "
        "container."),
    KnownProblem(
        "Windows", lambda f: f.platform == "win32",
        "torch's Windows builds may lack libuv, so a TCPStore rendezvous (torchrun, env://) fails, and the "
        "kit's rank processes and sandbox are Linux-only.",
        "use WSL2: install Ubuntu (wsl --install), then clone the kit and run the README's two commands "
        "inside it."),
    KnownProblem(
        "a container's seccomp profile denies Landlock", _container_policy,
        "the container runtime's seccomp profile (Docker's default one, for example) refuses the Landlock "
        "syscalls, so the kernel's file rules cannot be applied to the ranks.",
        "run the container with a seccomp profile that allows landlock_create_ruleset, landlock_add_rule and "
        "landlock_restrict_self (docker run --security-opt seccomp=PROFILE.json)."),
    KnownProblem(
        "no Landlock", lambda f: _linux_lacks(f, "landlock") and not _container_policy(f),
        "this kernel has no Landlock: where seccomp user notification works, the test process enforces the "
        "same file rules itself (the file witness), but a verdict here is not sealed.",
        "a Linux kernel >= 5.13 built with CONFIG_SECURITY_LANDLOCK, with landlock in its lsm= boot "
        "parameter."),
    KnownProblem(
        "no seccomp user notification", lambda f: _linux_lacks(f, "seccomp"),
        "seccomp user notification is unavailable, so the file witness cannot watch what files the ranks "
        "open, and a verdict here is not sealed.",
        "a Linux kernel >= 5.19, and Yama's ptrace_scope below 2 (sysctl kernel.yama.ptrace_scope=1)."),
    KnownProblem(
        "no socket diagnostics", lambda f: _linux_lacks(f, "traffic"),
        "the kernel's socket tables (netlink inet_diag) cannot be read, so the traffic witness cannot check "
        "what the ranks sent against the trace, and a verdict here is not sealed.",
        "a kernel with CONFIG_INET_DIAG (modprobe tcp_diag), outside a sandbox that blocks netlink."),
    KnownProblem(
        "torch without libuv", lambda f: f.libuv.startswith("no"),
        "this torch has no libuv, so a TCPStore rendezvous (torchrun, init_method='env://') fails unless told "
        "otherwise. The kit's own ranks meet through a file store and are not affected.",
        "for your own scripts, set USE_LIBUV=0 before torchrun, or pass use_libuv=False to TCPStore."),
    KnownProblem(
        "no torch.distributed or gloo", lambda f: f.torch is not None and "gloo" not in f.backends,
        "this torch build has no torch.distributed with gloo, so no rank can start.",
        "install the kit's torch: python -m pip install torch==2.13.0"),
    KnownProblem(
        "gloo cannot form a world",
        lambda f: f.platform.startswith("linux") and f.check is not None and not f.check.ok,
        "the harness could not start a world of two gloo ranks and all_reduce in it (the error is above).",
        "if the error names an address or an interface, run export GLOO_SOCKET_IFNAME=lo (the loopback "
        "interface) and check that this host's name resolves: getent hosts $(hostname)"),
)


def doctor(problems: dict, config) -> int:
    """Gather, print, and say with the exit code whether the kit can run here."""
    facts = gather(config)
    render(facts, problems)
    return EXIT_PASS if facts.check is not None and facts.check.ok else EXIT_FAIL


def gather(config) -> Facts:
    """Every fact doctor reports, measured here; the 2-rank check runs as ``config`` would run the ranks."""
    total, available = _memory_gb()
    facts = Facts(platform=sys.platform, os=platform.platform(), python=platform.python_version(),
                  cores=os.cpu_count() or 1, memory_gb=total, available_gb=available, host_address=_host_address())
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return facts
    from harness import gpu_count, protections_here
    facts.torch, facts.cuda = torch.__version__, torch.version.cuda
    facts.gpus = tuple(torch.cuda.get_device_name(i) for i in range(gpu_count()))
    facts.distributed = dist.is_available()
    if facts.distributed:
        facts.backends = tuple(b for b, there in (("gloo", dist.is_gloo_available()),
                                                   ("nccl", dist.is_nccl_available())) if there)
        facts.libuv = _libuv()
    try:
        facts.protections = protections_here()
    except Exception as e:   # a platform the sandbox does not know: say so, and go on
        facts.protections = {"sealed": False, "missing": [f"unknown: {type(e).__name__}: {e}"]}
    if "gloo" in facts.backends:
        facts.check = _gloo_check(config)
    return facts


def _memory_gb() -> tuple[float, float | None]:
    """(total, available) in GB: /proc/meminfo where there is one, else the page count (total only)."""
    try:
        with open("/proc/meminfo") as f:
            kb = {line.split(":")[0]: int(line.split()[1]) for line in f}
        return kb["MemTotal"] * 1024 / _GB, kb["MemAvailable"] * 1024 / _GB
    except (OSError, KeyError, ValueError, IndexError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GB, None


def _host_address() -> str:
    """Where gloo binds when no interface is named: the address of this host's name, else loopback."""
    name = socket.gethostname()
    try:
        return f"{socket.gethostbyname(name)}, the address of this host's name ({name})"
    except OSError:
        return f"the loopback address: this host's name ({name}) does not resolve"


def _libuv() -> str:
    import torch.distributed as dist
    try:
        store = dist.TCPStore("localhost", 0, 1, True, wait_for_workers=False, use_libuv=True)
    except Exception as e:   # a build without libuv may refuse rather than fall back
        return f"no ({_first_line(e)})"
    return "yes" if store.libuvBackend else "no (TCPStore fell back to its own backend)"


def _all_reduce_on_each_rank() -> dict:
    """The check's rank function (it travels to the ranks by value, so it brings its own imports)."""
    import os
    import torch
    import torch.distributed as dist
    total = torch.ones(1)
    dist.all_reduce(total)
    return {"sum": total.item(), "interface": os.environ.get("GLOO_SOCKET_IFNAME")}


def _gloo_check(config) -> GlooCheck:
    import harness
    start = time.perf_counter()
    try:
        with harness.defaults(backend="gloo", landlock=config.landlock, memory_gb=config.rank_memory_gb):
            # a generous limit: the first call also starts the forkserver, which imports torch
            result = harness.run(_all_reduce_on_each_rank, _CHECK_RANKS, timeout=60)
        seconds, protections = time.perf_counter() - start, harness.protections()
    except Exception as e:   # whatever stops the world is the finding
        return GlooCheck(False, f"{type(e).__name__}: {_first_line(e)}")
    finally:
        harness.shutdown()
    sums = [v["sum"] for v in result.values]
    if sums != [float(_CHECK_RANKS)] * _CHECK_RANKS:
        return GlooCheck(False, f"all_reduce of ones on {_CHECK_RANKS} ranks gave {sums}")
    return GlooCheck(True, seconds=seconds, rank_gb=max(m["peak"] for m in result.memory) / _GB,
                     interface=result.values[0]["interface"], protections=protections)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0]


# ---- rendering ------------------------------------------------------------------------------------------

# what each protection guards (the README's "What a cheating submission can and cannot do")
GUARDS = {
    "landlock": "the kernel keeps each rank out of the kit's answers and tests and other ranks' folders; "
                "a rank writes only in its own",
    "seccomp": "each rank's filter refuses IPC that bypasses files, ptrace, new namespaces and Unix sockets",
    "uid": "each rank its own uid when the judge is root: no signalling, tracing or reading another process",
    "files": "the file witness: the test process sees what files the ranks open, below Python",
    "traffic": "the traffic witness: the kernel's TCP byte counters must match what the trace says was sent",
}


def render(facts: Facts, problems: dict, out=None):
    """Whole lines, never wrapped (see ``report.console``): a pasted report stays greppable."""
    from rich.text import Text
    con = console(out)

    def say(line: str = "", style: str = ""):
        con.print(Text(line, style=style), soft_wrap=True)

    say("judge.py doctor: what this machine has for the kit", "bold")
    for title, rows in (("machine", _machine_rows(facts)), ("gloo", _gloo_rows(facts))):
        say()
        say(title, "bold")
        for line in _aligned(rows):
            say(line)
    say()
    say("sandbox: what a grade can rest on", "bold")
    for line, style in _sandbox_lines(facts):
        say(line, style)
    say()
    say("problems: the largest world each one's tests start, and where it runs", "bold")
    for line in _aligned([("problem", "ranks", "gloo (CPU)", "NCCL (a GPU per rank)")] +
                         [_problem_row(p, facts) for _, p in sorted(problems.items())]):
        say(line)
    say()
    say("known problems here", "bold")
    found = [k for k in KNOWN_PROBLEMS if k.applies(facts)]
    for known in found:
        say(f"  {known.name}: {known.problem}", "yellow")
        say(f"    fix: {known.fix}")
    if not found:
        say("  none of the known platform problems applies here")
    say()
    if facts.check is not None and facts.check.ok:
        say("ready: the problems run here on gloo", "bold green")
    else:
        say("NOT ready: no world of gloo ranks could start here; see the fixes above", "bold red")


def _aligned(rows: list) -> list:
    """Rows of cells as lines, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]


def _machine_rows(facts: Facts) -> list:
    build = f"CUDA {facts.cuda} build" if facts.cuda else "CPU build"
    torch = f"{facts.torch} ({build})" if facts.torch else "not installed: python -m pip install torch==2.13.0"
    free = f" ({facts.available_gb:.1f} GB available)" if facts.available_gb is not None else ""
    return [("OS", facts.os), ("Python", facts.python), ("torch", torch),
            ("cores", str(facts.cores)), ("memory", f"{facts.memory_gb:.1f} GB{free}"),
            ("GPUs", f"{len(facts.gpus)}: {', '.join(facts.gpus)}" if facts.gpus else "none")]


def _gloo_rows(facts: Facts) -> list:
    if not facts.distributed:
        return [("torch.distributed", "not available in this torch build")]
    check = facts.check
    interface = check.interface if check and check.ok else os.environ.get("GLOO_SOCKET_IFNAME")
    rows = [("torch.distributed", f"available; backends: {', '.join(facts.backends) or 'none'}"),
            ("libuv", f"{facts.libuv} (TCPStore's backend, for torchrun; the kit's ranks meet through a file store)"),
            ("interface", f"GLOO_SOCKET_IFNAME={interface}" if interface else
             f"GLOO_SOCKET_IFNAME not set: gloo binds to {facts.host_address}")]
    if check is None:
        return rows
    result = (f"ok: all_reduce on {_CHECK_RANKS} ranks in {check.seconds:.1f} s, starting the world included; "
              f"a rank holds {check.rank_gb:.2f} GB") if check.ok else f"FAILED: {check.detail}"
    return rows + [(f"{_CHECK_RANKS}-rank check", result)]


def _sandbox_lines(facts: Facts) -> list:
    """(line, style): each protection's state and what it guards; whether --sealed grades here; and
    whether the check's ranks were confined as this machine allows."""
    here = facts.protections
    missing = {m.split(":")[0] for m in here.get("missing", ())}
    measures = [m for m in here if m not in ("sealed", "missing")]
    states = _aligned([(m, "missing" if m in missing else "in force", here[m]) for m in measures]) if measures else []
    lines = []
    for measure, state in zip(measures, states):
        lines += [(state, "yellow" if measure in missing else ""), (f"    {GUARDS.get(measure, '')}", "dim")]
    if here.get("sealed"):
        lines.append(("  sealed: every protection is in force, so --sealed grades here", "green"))
    else:
        lines.append(("  not sealed: --sealed refuses to grade here, since " + "; ".join(here.get("missing") or ["?"])
                      + ". Practice is unaffected.", "yellow"))
    check = facts.check
    if check and check.ok and check.protections.get("sealed") != here.get("sealed"):
        line, style = protections_line(check.protections)
        lines.append((f"  but the check's ranks ran with {line}", style))
    return lines


def _problem_row(problem, facts: Facts) -> tuple:
    ranks = problem.max_world_size
    return (f"{problem.number} {problem.slug}", f"up to {ranks}", _gloo_cell(ranks, facts), _nccl_cell(ranks, facts))


def _gloo_cell(ranks: int, facts: Facts) -> str:
    check = facts.check
    if check is None or not check.ok:
        return "cannot run: no gloo world starts here"
    needed = ranks * check.rank_gb
    if facts.available_gb is not None and needed > facts.available_gb:
        return f"short of memory: {ranks} ranks hold {needed:.1f} GB or more, {facts.available_gb:.1f} GB available"
    if ranks > facts.cores:
        return f"runs, slowly: {ranks} ranks on {facts.cores} cores"
    return "runs"


def _nccl_cell(ranks: int, facts: Facts) -> str:
    if "nccl" not in facts.backends:
        return "no: a CPU build of torch" if not facts.cuda else "no: this torch has no NCCL"
    gpus = len(facts.gpus)
    if gpus >= ranks:
        return "a GPU per rank (python -m kit.gpucheck runs it)"
    return f"needs {ranks} GPUs, {gpus} here" + (f" (--backend auto: NCCL for worlds of up to {gpus})" if gpus else "")
