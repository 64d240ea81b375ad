"""What each traced op is: the c10d and functional-collective op tables, and the tensor arithmetic on them.

Which dispatcher ops carry communication and under which normalised kind (``KINDS``,
``FUNCTIONAL_KINDS``), where in an op's arguments this rank's input and output tensors sit
(``IN_ARG`` / ``OUT_ARG``), how many bytes an op moves, and how ``perturb`` changes what a send carries.  Pure
tables and functions: the recorder and the kernels read them.
"""
from __future__ import annotations

from types import MappingProxyType

import torch

# c10d op name -> normalised kind
KINDS = MappingProxyType({
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "barrier": "barrier", "monitored_barrier_": "barrier",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
})
# which positional argument holds what this rank contributes / receives into
IN_ARG = MappingProxyType({
    "allgather_": 1, "_allgather_base_": 1, "allgather_coalesced_": 1, "allgather_into_tensor_coalesced_": 1,
    "reduce_scatter_": 1, "_reduce_scatter_base_": 1, "reduce_scatter_tensor_coalesced_": 1,
    "alltoall_": 1, "alltoall_base_": 1, "gather_": 1, "scatter_": 1})
OUT_ARG = MappingProxyType({
    "allgather_": 0, "_allgather_base_": 0, "allgather_coalesced_": 0, "allgather_into_tensor_coalesced_": 0,
    "reduce_scatter_": 0, "_reduce_scatter_base_": 0, "reduce_scatter_tensor_coalesced_": 0,
    "alltoall_": 0, "alltoall_base_": 0, "recv_": 0, "recv_any_source_": 0,
    "gather_": 0, "scatter_": 0, "allreduce_": 0, "broadcast_": 0})

# functional collectives: dispatcher namespace -> op name -> normalised kind
# (batch_p2p_ops holds several sends and receives: it gets one record per entry)
FUNCTIONAL_KINDS = MappingProxyType({
    "_c10d_functional": MappingProxyType({
        "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
        "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
        "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
        "all_gather_into_tensor_coalesced": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter",
        "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
        "isend": "send", "irecv": "recv", "batch_p2p_ops": "send/recv"}),
    "_c10d_functional_autograd": MappingProxyType({
        "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
        "all_to_all_single": "all_to_all"}),
    "_dtensor": MappingProxyType({"shard_dim_alltoall": "all_to_all"}),
})

BACKEND_METHODS = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base",
    "allgather_coalesced", "reduce_scatter", "_reduce_scatter_base", "alltoall",
    "alltoall_base", "send", "recv", "recv_anysource", "reduce", "gather", "scatter",
    "barrier", "monitored_barrier",
)


def tensors_in(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in tensors_in(item)]
    return []


def nbytes_of(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def functional_out_bytes(kind: str, bound: dict, ins: list, group_size: int) -> int:
    """Bytes a functional collective writes on this rank, known before it runs (it allocates its output)."""
    if "out" in bound:
        return nbytes_of(tensors_in(bound["out"]))
    total = nbytes_of(ins)
    if kind == "send":
        return 0
    if kind == "all_gather":
        return total * group_size
    if kind == "reduce_scatter":
        return total // group_size
    if kind == "all_to_all" and bound.get("output_split_sizes") and ins and ins[0].dim() > 0 and ins[0].shape[0]:
        row_bytes = total // ins[0].shape[0]
        return sum(int(s) for s in bound["output_split_sizes"]) * row_bytes
    return total   # all_reduce, broadcast, recv, an even all_to_all


def with_argument(names: list, args: tuple, kwargs: dict, name: str, value):
    """(args, kwargs) with the argument called ``name`` replaced, wherever it was passed."""
    index = names.index(name)
    if index < len(args):
        return args[:index] + (value,) + args[index + 1:], kwargs
    return args, {**kwargs, name: value}


def perturbed_copies(tensors) -> list:
    """Copies of what a send carries, each changed (+1; ``not`` for bool): the sender's tensors stay as they are."""
    copies = []
    with torch.no_grad():
        for t in tensors:
            copy = t.detach().clone()
            copies.append(copy.logical_not_() if copy.dtype == torch.bool else copy.add_(1))
    return copies


