"""What confined the ranks, in one plain-data summary that every report carries, and whether it is sealed.

Each rank reports, before any code under test runs, the state of each measure (``confine``'s dict);
the world adds its witnesses.  A run is **sealed** when every measure was in force for every rank of
every world: a grade can then rest on it.  Otherwise the summary says which measure was missing, and why.
"""
from __future__ import annotations

# measure -> what its state starts with when it is in force
IN_FORCE = {"landlock": ("ABI",), "seccomp": ("on",), "uid": ("rank uid", "not needed"),
            "files": ("landlock", "enforced")}


def in_force(measure: str, state: str) -> bool:
    return str(state).startswith(IN_FORCE.get(measure, ("on",)))


def summarise(states: list, earlier: dict | None = None) -> dict:
    """One summary of many ranks' states (and of an ``earlier`` summary): where they differ, the weakest."""
    summary = {k: v for k, v in (earlier or {}).items() if k != "sealed"}
    for state in states:
        for measure, value in state.items():
            if measure not in summary or (in_force(measure, summary[measure]) and not in_force(measure, value)):
                summary[measure] = value
    summary["sealed"] = bool(summary) and all(in_force(m, v) for m, v in summary.items())
    return summary


def missing(summary: dict) -> list:
    """The measures not in force, as 'measure: state' lines."""
    return [f"{m}: {v}" for m, v in summary.items() if m != "sealed" and not in_force(m, v)]
