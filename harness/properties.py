"""Property checks whose failures read as plain sentences."""
from __future__ import annotations


class PropertyFailed(AssertionError):
    """A property of the problem does not hold.  The message says which, where and by how much."""


def _where(rank=None, step=None) -> str:
    parts = [f"rank {rank}" if rank is not None else "", f"step {step}" if step is not None else ""]
    return ", ".join(p for p in parts if p)


def check(condition: bool, message: str, rank=None, step=None):
    if not condition:
        where = _where(rank, step)
        raise PropertyFailed(f"{message}" + (f" ({where})" if where else ""))


def assert_close(actual, expected, what: str, rank=None, step=None, atol: float = 1e-9,
                 rtol: float = 1e-7, exact: bool = False):
    """Compare two tensors; on failure say which tensor, where, the max difference and its index."""
    import torch
    where = _where(rank, step)
    prefix = f"{what}" + (f" on {where}" if where else "")
    if not isinstance(actual, torch.Tensor):
        raise PropertyFailed(f"{prefix}: expected a tensor, got {type(actual).__name__}")
    actual = actual.detach().cpu()
    expected = torch.as_tensor(expected).detach().cpu()
    if tuple(actual.shape) != tuple(expected.shape):
        raise PropertyFailed(f"{prefix}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise PropertyFailed(f"{prefix}: dtype {actual.dtype}, expected {expected.dtype}")
    if actual.numel() == 0:
        return
    a, e = actual.double(), expected.double()
    if exact or not actual.is_floating_point():
        bad = a != e
        tolerance = "exact"
    else:
        bad = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=False)
        tolerance = f"atol={atol:g} rtol={rtol:g}"
    if bool(bad.any()):
        diff = (a - e).abs().nan_to_num(nan=float("inf"))
        flat = int(torch.nonzero(bad.flatten())[0])
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), actual.shape)) if actual.dim() else ()
        got, want = a.flatten()[flat].item(), e.flatten()[flat].item()
        digits = _digits_to_tell_apart(got, want)
        raise PropertyFailed(
            f"{prefix}: {int(bad.sum())} of {actual.numel()} values differ; max abs diff "
            f"{float(diff.max()):.3g}; first mismatch at index {index}: got {got:.{digits}g}, "
            f"expected {want:.{digits}g} ({tolerance})")


def _digits_to_tell_apart(got: float, want: float) -> int:
    """Enough significant digits that the two printed numbers differ (6 when that is already enough)."""
    for digits in range(6, 18):
        if f"{got:.{digits}g}" != f"{want:.{digits}g}":
            return digits
    return 17
