"""The communication trace: what each rank really sent, recorded by the harness.

Records are made inside the ranks (see ``_recorder.py``) and shipped back to the
test process as plain data, so tests assert on them without trusting anything
the learner's code reports about itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field

P2P_KINDS = ("send", "recv")
ROOTED_KINDS = ("broadcast", "reduce", "gather", "scatter")   # they record their ``root``
COLLECTIVE_KINDS = (
    "all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
    "barrier", "reduce", "gather", "scatter",
)


@dataclass
class CommOp:
    """One communication op issued by one rank, as the harness saw it."""

    rank: int            # the global rank that issued it
    index: int           # order of issue on this rank, from 0
    kind: str            # normalised: "all_reduce", "send", ... (see COLLECTIVE_KINDS, P2P_KINDS)
    name: str            # the op that ran, e.g. "c10d.allreduce_.default", "_c10d_functional.all_reduce.default"
    shapes: list         # shapes of the tensors this rank contributes
    dtypes: list         # their dtypes, as strings ("torch.float32")
    in_bytes: int        # bytes of the tensors this rank contributes (sent, reduced, gathered from)
    out_bytes: int       # bytes of the tensors this rank receives into
    peer: int | None     # global rank of the other side, for send/recv
    group: tuple         # global ranks of the group it ran on
    phase: str | None    # innermost ``harness.phase`` active when it was issued
    step: int | None     # the step given to that phase, if any
    site: str            # "file:line" of the user code that issued it
    issued_at: float     # seconds since the call started
    wait_start: float | None = None   # when a Python ``wait()`` on it began (None: never waited from Python)
    wait_end: float | None = None
    blocking: bool | None = None      # True when that wait ran inside the statement that issued it
    splits: tuple | None = None       # (output_split_sizes, input_split_sizes) for all_to_all
    root: int | None = None           # global rank of the root, for ROOTED_KINDS
    # compute calls (matmul family, fused attention, softmax, exp: ``record.compute``) this rank ran
    # between issuing the op and starting to wait on it; None unless the call counts compute
    # (``probes.Compute``), or when it was never waited on.  A wait in the issuing statement gives 0.
    compute_between: int | None = None
    # of those, the ones a backward pass later went through: work the result depended on (None: no backward)
    compute_used: int | None = None
    perturbed: bool = False           # this send carried a perturbed copy of its tensor (``perturb=``)

    @property
    def is_p2p(self) -> bool:
        return self.kind in P2P_KINDS

    @property
    def is_async(self) -> bool:
        """Issued without blocking the issuing statement."""
        return self.blocking is not True

    def describe(self) -> str:
        where = f" {'to' if self.kind == 'send' else 'from'} rank {self.peer}" if self.is_p2p else ""
        shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        return f"{self.kind}{where} [{shapes}] {self.in_bytes} B at {self.site}"


@dataclass
class PhaseSpan:
    rank: int
    name: str
    step: int | None
    start: float
    end: float | None


@dataclass
class Trace:
    """Every rank's communication ops and marked phases for one ``harness.run`` call."""

    ops_by_rank: list = field(default_factory=list)     # list[list[CommOp]]
    phases_by_rank: list = field(default_factory=list)  # list[list[PhaseSpan]]

    @property
    def world_size(self) -> int:
        return len(self.ops_by_rank)

    def ops(self, rank: int | None = None, kind: str | tuple | None = None,
            phase: str | None = None, step: int | None = None) -> list[CommOp]:
        ranks = range(self.world_size) if rank is None else [rank]
        kinds = (kind,) if isinstance(kind, str) else kind
        return [op for r in ranks for op in self.ops_by_rank[r]
                if (kinds is None or op.kind in kinds)
                and (phase is None or op.phase == phase)
                and (step is None or op.step == step)]

    def collectives(self, rank: int) -> list[CommOp]:
        return [op for op in self.ops_by_rank[rank] if not op.is_p2p]

    def bytes_sent(self, rank: int) -> int:
        """Bytes this rank pushed into the network: p2p sends plus collective inputs."""
        return sum(op.in_bytes for op in self.ops_by_rank[rank] if op.kind != "recv")

    def phases(self, rank: int, name: str | None = None) -> list[PhaseSpan]:
        return [p for p in self.phases_by_rank[rank] if name is None or p.name == name]

    def kinds(self, rank: int) -> list[str]:
        return [op.kind for op in self.ops_by_rank[rank]]
