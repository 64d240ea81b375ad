"""The point-to-point cost figures the pipeline problems share (118, 122, 130): who sends how many bytes to whom.

A pipeline's cost model names three figures of its sends: ``bytes per rank`` (what one rank sends), ``busiest
link`` (what one rank sends to one peer, a link being one direction between two neighbours) and ``messages per
rank`` (how many sends one rank issues).  The tests build the model's sends from the op lists (what each op must
send, to whom, of what size) and the measured ones from the harness's trace; both go through ``SendCost``, so the
model and the measurement are counted the same way.
"""
from collections import Counter
from dataclasses import dataclass

import harness


# The closed forms of a pipeline of one stage per rank (118's 1F1B, 130's ZB-H1: the same messages in another
# order), in the statements' symbols, as ``check_sends`` names them in a failure.
ONE_STAGE_PER_RANK = {
    "bytes per rank": "2m · numel(act_shape) · elem_size for an inner stage, half for an end stage",
    "busiest link": "m · numel(act_shape) · elem_size each way between neighbours",
    "messages per rank": "2m sends for an inner stage, m for an end stage"}


@dataclass
class SendCost:
    bytes_of: Counter      # rank -> bytes it sends
    link_bytes: Counter    # (rank, peer) -> bytes the rank sends to that peer
    messages_of: Counter   # rank -> how many sends it issues

    @classmethod
    def of(cls, sends) -> "SendCost":
        """``sends``: (rank, peer, bytes) for each send."""
        cost = cls(Counter(), Counter(), Counter())
        for rank, peer, size in sends:
            cost.bytes_of[rank] += size
            cost.link_bytes[(rank, peer)] += size
            cost.messages_of[rank] += 1
        return cost

    @classmethod
    def traced(cls, trace) -> "SendCost":
        """The sends the harness's trace saw, on every rank."""
        return cls.of((op.rank, op.peer, op.in_bytes) for op in trace.ops(kind="send"))

    def figures(self) -> dict:
        """The catalogue's figures: the most over the ranks (bytes, messages) and over the links."""
        return {"bytes per rank": max(self.bytes_of.values(), default=0),
                "busiest link": max(self.link_bytes.values(), default=0),
                "messages per rank": max(self.messages_of.values(), default=0)}


def check_sends(model: SendCost, measured: SendCost, formulas: dict, what: str) -> None:
    """Every rank's bytes and messages, and every link's bytes, are the model's exactly (not only the largest:
    a wasteful end stage counts too).  ``formulas``: figure name -> its closed form, in words that say which
    rank or link it is for, for the message."""
    for rank in sorted(set(model.bytes_of) | set(measured.bytes_of) | set(measured.messages_of)):
        harness.check(measured.bytes_of[rank] == model.bytes_of[rank],
                      f"{what}: bytes per rank: rank {rank} sent {measured.bytes_of[rank]} bytes; the cost model's "
                      f"is {model.bytes_of[rank]} ({formulas['bytes per rank']})", rank=rank)
        harness.check(measured.messages_of[rank] == model.messages_of[rank],
                      f"{what}: messages per rank: rank {rank} issued {measured.messages_of[rank]} sends; the cost "
                      f"model's is {model.messages_of[rank]} ({formulas['messages per rank']})",
                      rank=rank)
    for (rank, peer) in sorted(set(model.link_bytes) | set(measured.link_bytes)):
        harness.check(measured.link_bytes[(rank, peer)] == model.link_bytes[(rank, peer)],
                      f"{what}: busiest link: rank {rank} sent {measured.link_bytes[(rank, peer)]} bytes to rank "
                      f"{peer}; the cost model's is {model.link_bytes[(rank, peer)]} ({formulas['busiest link']})",
                      rank=rank)


def figure_pairs(model: SendCost, measured: SendCost) -> dict:
    """The figures as ``testkit.cost.record`` takes them: name (underscores) -> (model, yours)."""
    yours = measured.figures()
    return {name.replace(" ", "_"): (value, yours[name]) for name, value in model.figures().items()}
