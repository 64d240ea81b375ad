"""Property checks whose failures read as plain sentences."""
from __future__ import annotations


class PropertyFailed(AssertionError):
    """A property of the problem does not hold.  The message says which, where and by how much.

    ``case`` (optional) names the input that broke it when that is not the case hypothesis drew,
    e.g. a statement example checked alongside every drawn case; reports show it instead.
    """

    def __init__(self, message: str = "", case=None):
        super().__init__(message)
        self.case = case


class WrongType(PropertyFailed):
    """A function under test returned a value of the wrong type (see ``expect_type``)."""


def _where(rank=None, step=None) -> str:
    parts = [f"rank {rank}" if rank is not None else "", f"step {step}" if step is not None else ""]
    return ", ".join(p for p in parts if p)


def check(condition: bool, message: str, rank=None, step=None, case=None):
    """Raise ``PropertyFailed(message)`` unless ``condition``.

    ``case`` says which input broke the property when it is not the drawn case (a fixed
    example checked alongside it): ``case="make_buckets([4, 4, 4, 4], 8)"``.
    """
    if not condition:
        where = _where(rank, step)
        raise PropertyFailed(f"{message}" + (f" ({where})" if where else ""), case=case)


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


# ---- return types ------------------------------------------------------------------------------

def expect_type(value, spec: str, call: str, rank=None):
    """Check a returned value against the contract's type before any property uses it.

    ``spec`` is written as in the statement's signature: ``int``, ``float`` (an int is accepted),
    ``bool``, ``str``, ``None``, ``Tensor``, ``Any``, ``list[X]``, ``tuple[X, Y]``, ``tuple[X, ...]``,
    ``dict[K, V]``, ``set[X]`` and unions ``X | Y``.  Containers are exact: a tuple is not a list
    and a list is not a tuple.  Raises ``WrongType`` naming the call, the expected type and what
    came back (and where inside it, for nested values)::

        harness.expect_type(got, "list[list[int]]", f"make_buckets({sizes}, {cap})")

    Returns ``value``, so it can wrap an expression.
    """
    problem = _mismatch(value, _parse_type(spec), "")
    if problem is None:
        return value
    where, wanted, found = problem
    shown = _short_repr(value)
    if where:
        detail = f"it returned {shown}, whose item {where} is {found}, not {wanted}"
    else:
        detail = f"it returned {found}: {shown}"
    hint = ""
    if found.startswith("a tuple") and wanted.startswith("list"):
        hint = " (a tuple is not a list: return a list)"
    elif found.startswith("a list") and wanted.startswith("tuple"):
        hint = " (a list is not a tuple: return a tuple)"
    on_rank = f" on rank {rank}" if rank is not None else ""
    raise WrongType(f"{call}{on_rank} should return {spec}; {detail}{hint}", case=call)


def _a(value) -> str:
    if value is None:
        return "None"
    name = type(value).__name__
    if name == "Tensor":
        return "a Tensor"
    return ("an " if name[0].lower() in "aeiou" else "a ") + name


def _short_repr(value) -> str:
    """The value as Python would print it, with long containers elided as ``...`` (never cut mid-item)."""
    import reprlib
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdict = 8
    r.maxstring, r.maxother, r.maxlevel = 60, 80, 4
    return r.repr(value)


class _T:
    """A parsed type: ``name`` with ``args`` ('...' for a variadic tuple); name '|' is a union."""

    def __init__(self, name, args=()):
        self.name, self.args = name, tuple(args)

    def __str__(self):
        if self.name == "|":
            return " | ".join(map(str, self.args))
        return f"{self.name}[{', '.join(map(str, self.args))}]" if self.args else self.name


_NAMES = {"int", "float", "bool", "str", "bytes", "complex", "None", "Tensor", "torch.Tensor", "Any", "object",
          "list", "tuple", "dict", "set"}


def _parse_type(spec: str) -> _T:
    import re
    tokens = re.findall(r"torch\.Tensor|\.\.\.|[A-Za-z_]\w*|[\[\],|]", spec)
    pos = 0

    def fail(why="cannot read it"):
        raise ValueError(f"expect_type: the type {spec!r}: {why}")

    if "".join(tokens) != spec.replace(" ", ""):
        fail()

    def take(expected=None):
        nonlocal pos
        if pos >= len(tokens) or (expected is not None and tokens[pos] != expected):
            fail()
        pos += 1
        return tokens[pos - 1]

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def union():
        options = [atom()]
        while peek() == "|":
            take("|")
            options.append(atom())
        return options[0] if len(options) == 1 else _T("|", options)

    def atom():
        name = take()
        if name not in _NAMES:
            fail(f"unknown type {name!r}")
        if peek() != "[":
            return _T(name)
        take("[")
        args = []
        while True:
            args.append(take("...") if peek() == "..." else union())
            if peek() != ",":
                break
            take(",")
        take("]")
        return _T(name, args)

    result = union()
    if pos != len(tokens):
        fail()
    return result


def _mismatch(value, t: _T, where: str):
    """None when ``value`` fits ``t``; else (where inside the value, the type wanted there, what was found)."""
    import numbers
    name = t.name
    wrong = (where, str(t), _a(value))
    if name == "|":
        found = [_mismatch(value, option, where) for option in t.args]
        if any(f is None for f in found):
            return None
        deeper = [f for f in found if f[0] != where]   # the value's own type fits one option: say what inside does not
        return deeper[0] if len(deeper) == 1 else wrong
    if name in ("Any", "object"):
        return None
    simple = {
        "None": lambda v: v is None,
        "int": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
        "complex": lambda v: isinstance(v, numbers.Number) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "bytes": lambda v: isinstance(v, bytes),
    }
    if name in simple:
        return None if simple[name](value) else wrong
    if name in ("Tensor", "torch.Tensor"):
        import torch
        return None if isinstance(value, torch.Tensor) else wrong
    container = {"list": list, "tuple": tuple, "dict": dict, "set": (set, frozenset)}[name]
    if not isinstance(value, container):
        return wrong
    if not t.args:
        return None
    if name in ("list", "set"):
        items = [(f"{where}[{i}]", item, t.args[0]) for i, item in enumerate(value)]
    elif name == "dict":
        key_t, value_t = (t.args + (_T("Any"),))[:2]
        items = [pair for k, v in value.items()
                 for pair in ((f"{where} key {k!r}", k, key_t), (f"{where}[{k!r}]", v, value_t))]
    elif len(t.args) == 2 and t.args[1] == "...":
        items = [(f"{where}[{i}]", item, t.args[0]) for i, item in enumerate(value)]
    elif len(value) != len(t.args):
        return (where, str(t), f"a tuple of {len(value)} item{'' if len(value) == 1 else 's'}")
    else:
        items = [(f"{where}[{i}]", item, a) for i, (item, a) in enumerate(zip(value, t.args))]
    for inner_where, item, inner_t in items:
        found = _mismatch(item, inner_t, inner_where)
        if found:
            return found
    return None
