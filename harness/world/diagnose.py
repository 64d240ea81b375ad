"""Turn a failed call -- ranks that raised, hung or crashed -- into a report a learner can act on."""
from __future__ import annotations

import linecache
import os
import re
import signal
import time

from ..errors import ForbiddenOp, NotImplementedYet, RankError, TraceTampered, raised_by_stub

ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # harness/, whatever module asks
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')


def _is_library(path: str) -> bool:
    return (path.startswith(ENGINE_DIR) or "/site-packages/" in path or "/lib/python3" in path
            or path.startswith("<"))


def _threads(stack_dump: str) -> list[list[tuple]]:
    threads, current = [], None
    for line in stack_dump.splitlines():
        if "most recent call first" in line:
            current = []
            threads.append(current)
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            current.append((m["file"], int(m["line"]), m["func"].strip()))
    return threads


def blocking_line(stack_dump: str) -> str | None:
    """The innermost user frame of the rank's main loop thread, with its source line."""
    threads = _threads(stack_dump)
    main = next((t for t in threads if any(f.endswith("_rank.py") for f, _, _ in t)), threads[0] if threads else [])
    for file, line, func in main:  # innermost first
        if not _is_library(file):
            source = linecache.getline(file, line).strip()
            return f"{short_path(file)}:{line} in {func}: {source}"
    return None


def short_path(path: str) -> str:
    """Relative to the working directory when inside it: messages stay readable."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _pending(flight: list) -> dict | None:
    """The rank's op it is stuck in: the last issued op whose Python wait never returned."""
    issued, done, waiting = {}, set(), set()
    for ev in flight:
        if ev["ev"] == "issue":
            issued[ev["i"]] = ev
        elif ev["ev"] == "wait":
            waiting.add(ev["i"])
        elif ev["ev"] == "done":
            done.add(ev["i"])
    stuck = [issued[i] for i in sorted(waiting - done) if i in issued]
    return stuck[-1] if stuck else (issued[max(issued)] if issued else None)


def _in_wait(flight: list) -> bool:
    """Whether the rank is inside a wait on an op that has not finished."""
    waiting, done = set(), set()
    for ev in flight:
        if ev["ev"] == "wait":
            waiting.add(ev["i"])
        elif ev["ev"] == "done":
            done.add(ev["i"])
    return bool(waiting - done)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _collectives(flight: list) -> list:
    return [ev for ev in flight if ev["ev"] == "issue" and ev["kind"] not in ("send", "recv")]


def diagnose_hang(flights: list, stuck: list, where: dict) -> str | None:
    # 1. Collective sequences that disagree between the members of a group (each group on its own:
    #    ranks 0-1 reducing in their group while 2-3 broadcast in theirs is no disagreement).
    for group in sorted({tuple(ev.get("group") or range(len(flights))) for f in flights for ev in _collectives(f)}):
        found = _disagreement(flights, group, stuck, where)
        if found:
            return found
    # 2. Point-to-point: who waits on whom.
    pend = {r: _pending(flights[r]) for r in stuck}
    p2p = {r: ev for r, ev in pend.items() if ev and ev["kind"] in ("send", "recv")}
    if p2p:
        for kind in ("recv", "send"):
            same = [r for r, ev in p2p.items() if ev["kind"] == kind]
            if len(same) >= 2 and all(p2p[r]["peer"] in p2p for r in same):
                if kind == "recv":
                    return (f"ranks {_names(same)} {_both(same)} wait in recv(): p2p deadlock -- each waits for a "
                            "message its peer never sends; post the sends first, or use isend/irecv")
                return (f"ranks {_names(same)} {_both(same)} wait in a blocking send(): on gloo send() waits until the "
                        "peer posts the matching recv, so two ranks that both send first deadlock; "
                        "use isend/irecv or batch_isend_irecv")
        r, ev = sorted(p2p.items())[0]
        peer = ev["peer"]
        if peer is not None and peer not in stuck:
            verb = "a message from" if ev["kind"] == "recv" else "rank to receive from"
            return (f"rank {r} waits in {ev['kind']}() for {verb} rank {peer}, which already returned "
                    "without the matching " + ("send" if ev["kind"] == "recv" else "recv"))
        return f"rank {r} waits in {ev['kind']}() with rank {peer} ({ev['site']}), which never matches it"
    # 3. A rank that is not communicating at all.
    busy = [r for r in stuck if pend.get(r) is None]
    if busy:
        r = busy[0]
        return f"rank {r} is not inside a communication op: it is still computing at {where.get(r)} (an endless loop?)"
    return None


def _disagreement(flights: list, group: tuple, stuck: list, where: dict) -> str | None:
    members = [r for r in group if r < len(flights)]
    seqs = {r: [ev for ev in _collectives(flights[r]) if tuple(ev.get("group") or range(len(flights))) == group]
            for r in members}
    for i in range(max((len(s) for s in seqs.values()), default=0)):
        present = {r: s[i] for r, s in seqs.items() if i < len(s)}
        kinds = {ev["kind"] for ev in present.values()}
        if len(kinds) > 1:
            a, b = sorted(present)[:2]
            for r in sorted(present)[1:]:
                if present[r]["kind"] != present[a]["kind"]:
                    b = r
                    break
            return (f"rank {b}'s {_ordinal(i + 1)} collective is {present[b]['kind']} "
                    f"({present[b]['site']}), rank {a}'s is {present[a]['kind']} ({present[a]['site']}): "
                    "every rank must issue the same collectives in the same order")
        shapes = {r: ev.get("shapes") for r, ev in present.items()}
        if len({repr(v) for v in shapes.values()}) > 1:
            a = min(present)
            b = next(r for r in sorted(present) if shapes[r] != shapes[a])
            return (f"the ranks' {_ordinal(i + 1)} collective ({present[a]['kind']}) has tensors of shape "
                    f"{_shape(shapes[b])} on rank {b} ({present[b]['site']}) but {_shape(shapes[a])} on rank {a}: "
                    "every rank must pass tensors of the same size")
        missing = [r for r in members if r not in present]
        if missing and present:
            r0 = min(present)
            ev = present[r0]
            computing = [r for r in missing if r in stuck and not _in_wait(flights[r])]
            if computing:
                return (f"rank {r0} waits in its {_ordinal(i + 1)} collective ({ev['kind']} at {ev['site']}), "
                        f"but rank {computing[0]} never got there: it is not inside a communication op, it is "
                        f"still computing at {where.get(computing[0])} (an endless loop?)")
            return (f"rank {r0} waits in its {_ordinal(i + 1)} collective ({ev['kind']} at {ev['site']}), "
                    f"which rank{'s' if len(missing) > 1 else ''} {_names(missing)} never issued: "
                    "a collective skipped on some ranks (a rank-dependent if?)")
    return None


def _shape(shapes) -> str:
    return ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes or [])


def _both(ranks: list) -> str:
    return "both" if len(ranks) == 2 else "all"


def _names(ranks: list) -> str:
    ranks = sorted(ranks)
    return ", ".join(map(str, ranks[:-1])) + " and " + str(ranks[-1]) if len(ranks) > 1 else str(ranks[0])


def hang_message(timeout: float, stuck: list, where: dict, flights: list, diagnosis: str | None) -> str:
    lines = [f"the ranks did not finish within {timeout:g} s (ranks still running: {_names(stuck)})"]
    if diagnosis:
        lines.append(f"diagnosis: {diagnosis}")
    for r in sorted(where):
        last = [ev for ev in flights[r] if ev["ev"] == "issue"]
        if r in stuck:
            lines.append(f"  rank {r} is blocked at: {where[r] or '(no frame of your code on its stack)'}")
        else:
            lines.append(f"  rank {r} finished the call")
        if last:
            ev = last[-1]
            peer = f" peer {ev['peer']}" if ev.get("peer") is not None else ""
            lines.append(f"      last comm op: #{ev['i'] + 1} {ev['kind']}{peer} at {ev['site']}")
    return "\n".join(lines)


_GLOO_ABORTS = {
    "doesn't match expected size": "gloo found a size mismatch between two matched ops: "
                                   "the ranks passed tensors of different sizes to the same collective or send/recv",
    "Connection closed by peer": "its peer died first",
}


def crash_message(rank: int, exitcode: int | None, stderr: str) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    lines = [f"rank {rank} {how}"]
    for needle, meaning in _GLOO_ABORTS.items():
        if needle in stderr:
            lines[0] += f": {meaning}"
            break
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-8:]
    if tail:
        lines.append("  its last stderr lines:")
        lines.extend(f"    {line}" for line in tail)
    return "\n".join(lines)


_GLOO_NOISE = ("Connection closed by peer", "Connection reset", "Timed out", "Gloo", "gloo")


def is_gloo_fallout(reply) -> bool:
    """A rank's error that only echoes another rank's failure (gloo's connection to it broke)."""
    return reply.status == "error" and any(s in str(reply.error[1]) for s in _GLOO_NOISE)


def rank_error(errors: dict, world_size: int) -> BaseException:
    """The exception for ranks' error replies (rank -> ``wire.Reply``): the root cause, preferring a rank
    whose error did not come from gloo's fallout."""
    rank, reply = sorted(errors.items(), key=lambda it: (is_gloo_fallout(it[1]), it[0]))[0]
    exc_type, message, frames = reply.error
    if reply.status == "forbidden":
        return ForbiddenOp(f"rank {rank}: {message}")
    if reply.status == "tampered":
        return TraceTampered(f"rank {rank}: {message}")
    cls = NotImplementedYet if exc_type == "NotImplementedError" and raised_by_stub(frames) else RankError
    return cls(rank, exc_type, message, frames, world_size)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def dump_stacks(procs: list, stack_files: list) -> list[str]:
    """Each rank's Python stack, dumped by faulthandler on SIGUSR1 (works while blocked in gloo)."""
    sizes = []
    for p, path in zip(procs, stack_files):
        sizes.append(_size(path))
        if p.is_alive():
            os.kill(p.pid, signal.SIGUSR1)
    # Wait until each live rank's dump has appeared and stopped growing: on a loaded machine a
    # fixed short sleep can read a rank's dump before it is written, losing its blocking line.
    alive = [r for r, p in enumerate(procs) if p.is_alive()]
    last, deadline = {}, time.monotonic() + 1.0   # stays inside the timeout + 2 s promise
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        now = {r: _size(stack_files[r]) for r in alive}
        if all(now[r] > sizes[r] and now[r] == last.get(r) for r in alive):
            break
        last = now
    stacks = []
    for path, size in zip(stack_files, sizes):
        try:
            with open(path, errors="replace") as f:
                f.seek(size)
                stacks.append(f.read())
        except OSError:
            stacks.append("")
    return stacks
