"""What confined the ranks, in one plain-data summary that every report carries, and whether it is sealed.

Each rank reports, before any code under test runs, the state of each measure (``confine``'s dict);
the world adds its witnesses.  A run is **sealed** when every measure was in force for every rank of
every world: a grade can then rest on it.  Otherwise ``missing`` says which measure was not, and why.
"""
from __future__ import annotations

# measure -> what its state starts with when it is in force
IN_FORCE = {"landlock": ("ABI",), "seccomp": ("on",), "uid": ("rank uid", "not needed"),
            "files": ("landlock", "enforced"), "traffic": ("kernel counters",)}


def in_force(measure: str, state: str) -> bool:
    return str(state).startswith(IN_FORCE.get(measure, ("on",)))


def summarise(states: list, earlier: dict | None = None) -> dict:
    """One summary of many ranks' states (and of an ``earlier`` summary): where they differ, the weakest."""
    summary = {k: v for k, v in (earlier or {}).items() if k not in ("sealed", "missing")}
    for state in states:
        for measure, value in state.items():
            if measure not in summary or (in_force(measure, summary[measure]) and not in_force(measure, value)):
                summary[measure] = value
    missing = [f"{m}: {v}" for m, v in summary.items() if not in_force(m, v)]
    summary["sealed"], summary["missing"] = bool(summary) and not missing, missing
    return summary


def protections_here() -> dict:
    """What this machine allows a rank, before any world starts (for a sealed run's pre-flight, and doctor):
    each measure's state as a world would report it, ``sealed`` and ``missing``."""
    import os
    from .landlock import landlock_abi
    from ._notify_filter import unavailable_reason
    abi = landlock_abi()
    notify_why = unavailable_reason()
    state = {"landlock": f"ABI {abi}" if isinstance(abi, int) else f"unavailable: {abi}",
             "seccomp": "on" if notify_why is None else f"unavailable: {notify_why}",
             "uid": "rank uid (each rank its own)" if os.geteuid() == 0 else "not needed: the judge is not root",
             "files": ("landlock" if isinstance(abi, int) else "enforced below Python") if notify_why is None
             else f"unavailable: {notify_why}", "traffic": _traffic_here()}
    return summarise([state])


def _traffic_here() -> str:
    from ..probes import _netdiag
    try:
        _netdiag.dump_all()
    except OSError as e:
        return f"unavailable: the kernel's socket tables cannot be read here ({e})"
    return "kernel counters"
