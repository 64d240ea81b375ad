"""What travels between the test process and a rank: calls out (pickled), replies back (plain data only).

A rank runs learner code, so its reply is untrusted input.  Pickle can name any
callable and run it while loading; this format cannot.  A reply is a JSON document
whose tagged nodes stand for the few non-JSON types a property needs, plus raw byte
blobs for tensor contents:

    None, bool, int, float, str, list          as JSON
    tuple, dict, set, bytes, complex           {"$t": [...]}, {"$d": [[k, v], ...]}, {"$s": [...]},
                                               {"$b": blob}, {"$c": [re, im]}
    torch.Tensor (any device, any dtype)       {"$T": [dtype name, shape, blob]}: a CPU copy, no grad
    torch.dtype, torch.device                  {"$dt": "float32"}, {"$dev": "cpu"}

Layout: 8-byte JSON length, the JSON, then each blob as an 8-byte length and its bytes.
``decode`` rebuilds only those types; anything else in a document is a ``WireError``.
A rank's answer to a call is a ``Reply``: exactly its fields, checked on arrival.

The other direction, a call from the test process to the ranks, is trusted and carries code: the
rank function pickled by value (``dump_function``, which keeps each code object's real file name),
and the call's arguments and ``Policy`` (``dumps``), after the call's token (TOKEN_BYTES).
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import json
import math
import os
import pickle
import struct
import sys
import time
import types
from collections import ChainMap
from dataclasses import dataclass

import cloudpickle

from .waiting import readable

TOKEN_BYTES = 16   # each call's random token, first in its payload and echoed in every reply

_MAX_DEPTH = 200
MAX_REPLY = 1 << 34   # 16 GiB: a frame header that names more is a forgery, not a reply
STATUSES = ("ok", "error", "forbidden", "tampered", "broken")


class WireError(ValueError):
    """A reply that does not follow the format (or a value that cannot be put in it)."""


@dataclass
class Reply:
    """A rank's answer to one call (the rank loop writes it; learner code never sees it)."""

    token: bytes | None = None   # the call's token: a reply without it was not written by the rank loop
    status: str = "ok"           # one of STATUSES
    value: object = None         # the rank function's return value (plain data)
    error: tuple | None = None   # (exception type name, message, frames of the code under test)
    retire: bool = False         # the rank asks for a fresh world after this call
    ops_traced: int = 0          # how many op records the rank's recorder holds
    ops_digest: str = ""         # ``policy.ops_digest`` of them
    probes: dict = dataclasses.field(default_factory=dict)   # each probe's rank-side result, by name

    def encode(self) -> bytes:
        return encode({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @classmethod
    def decode(cls, data: bytes) -> "Reply":
        """A reply from its bytes; ``WireError`` unless it has exactly these fields, of these types."""
        fields = decode(data)
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(fields, dict) or set(fields) != set(names):
            raise WireError(f"a reply with fields {sorted(fields, key=str) if isinstance(fields, dict) else fields!r}")
        reply = cls(**fields)
        error = reply.error
        if (reply.status not in STATUSES or not isinstance(reply.retire, bool) or type(reply.ops_traced) is not int
                or not isinstance(reply.ops_digest, str) or not isinstance(reply.probes, dict)
                or not (error is None or (
                    isinstance(error, tuple) and len(error) == 3 and isinstance(error[0], str)
                    and isinstance(error[1], str) and isinstance(error[2], list)))):
            raise WireError("a reply whose fields do not have the types the rank loop writes")
        return reply


def encode(value, name: str = "reply") -> bytes:
    """``name`` is how an error message refers to ``value``."""
    blobs: list[bytes] = []
    document = json.dumps(_to_json(value, blobs, name, 0), allow_nan=True).encode()
    parts = [struct.pack("<Q", len(document)), document]
    for blob in blobs:
        parts += [struct.pack("<Q", len(blob)), blob]
    return b"".join(parts)


def decode(data: bytes):
    try:
        (length,) = struct.unpack_from("<Q", data, 0)
        document = json.loads(data[8:8 + length])
        blobs, offset = [], 8 + length
        while offset < len(data):
            (size,) = struct.unpack_from("<Q", data, offset)
            blobs.append(data[offset + 8:offset + 8 + size])
            offset += 8 + size
    except (struct.error, ValueError, RecursionError) as e:
        raise WireError(f"a reply that is not in the harness's format ({type(e).__name__}: {e})") from None
    return _from_json(document, blobs, 0)


def _to_json(value, blobs: list, path: str, depth: int):
    import torch
    if depth > _MAX_DEPTH:
        raise WireError(f"{path} is nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [_to_json(v, blobs, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, tuple):   # torch.Size too
        return {"$t": [_to_json(v, blobs, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return {"$d": [[_to_json(k, blobs, f"{path} key", depth + 1), _to_json(v, blobs, f"{path}[{k!r}]", depth + 1)]
                       for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"$s": [_to_json(v, blobs, f"{path} item", depth + 1) for v in value]}
    if isinstance(value, (bytes, bytearray)):
        blobs.append(bytes(value))
        return {"$b": len(blobs) - 1}
    if isinstance(value, complex):
        return {"$c": [value.real, value.imag]}
    if isinstance(value, torch.Tensor):
        return _tensor_to_json(value, blobs, path)
    if isinstance(value, torch.dtype):
        return {"$dt": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$dev": str(value)}
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        return _to_json(value.item(), blobs, path, depth)    # a numpy scalar
    if hasattr(value, "__array__"):
        return _tensor_to_json(torch.as_tensor(value), blobs, path)   # a numpy array
    raise WireError(f"{path} is a {type(value).__module__}.{type(value).__qualname__}; rank functions return "
                    "plain data: numbers, strings, lists, tuples, dicts, sets, bytes and tensors")


def _tensor_to_json(tensor, blobs: list, path: str):
    import torch
    if tensor.device.type == "meta":
        raise WireError(f"{path} is a tensor on device meta, made without naming a device: make it on "
                        "harness.device() (the rank's GPU under NCCL, the CPU under gloo)")
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise WireError(f"{path} is a {tensor.layout} tensor: only dense tensors with data can be sent back")
    flat = tensor.detach().cpu().contiguous()
    blobs.append(flat.view(-1).view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return {"$T": [str(flat.dtype).removeprefix("torch."), list(flat.shape), len(blobs) - 1]}


def _from_json(node, blobs: list, depth: int):
    if depth > _MAX_DEPTH:
        raise WireError(f"a reply nested more than {_MAX_DEPTH} levels deep")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_from_json(v, blobs, depth + 1) for v in node]
    if not isinstance(node, dict) or len(node) != 1:
        raise WireError(f"a reply holds an untagged object {str(node)[:80]}")
    (tag, body), = node.items()
    if tag == "$t":
        return tuple(_from_json(v, blobs, depth + 1) for v in _list(body))
    if tag == "$d":
        return {_from_json(k, blobs, depth + 1): _from_json(v, blobs, depth + 1) for k, v in _pairs(body)}
    if tag == "$s":
        return {_from_json(v, blobs, depth + 1) for v in _list(body)}
    if tag == "$b":
        return _blob(blobs, body)
    if tag == "$c" and len(_list(body)) == 2 and all(isinstance(x, (int, float)) for x in body):
        return complex(*body)
    if tag == "$T":
        return _tensor(body, blobs)
    if tag == "$dt":
        return _dtype(body)
    if tag == "$dev" and isinstance(body, str):
        import torch
        return torch.device(body)
    raise WireError(f"a reply holds an unknown tag {tag!r}")


def _list(body) -> list:
    if not isinstance(body, list):
        raise WireError("a reply holds a malformed node")
    return body


def _pairs(body) -> list:
    if not all(isinstance(p, list) and len(p) == 2 for p in _list(body)):
        raise WireError("a reply holds a malformed dict")
    return body


def _blob(blobs: list, index) -> bytes:
    if not isinstance(index, int) or not 0 <= index < len(blobs):
        raise WireError("a reply names a blob it does not carry")
    return blobs[index]


def _dtype(name):
    import torch
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise WireError(f"a reply names an unknown dtype {name!r}")
    return dtype


def _tensor(body, blobs: list):
    import torch
    if not (isinstance(body, list) and len(body) == 3 and isinstance(body[1], list)
            and all(isinstance(d, int) and d >= 0 for d in body[1])):
        raise WireError("a reply holds a malformed tensor")
    dtype, shape, data = _dtype(body[0]), body[1], _blob(blobs, body[2])
    numel = math.prod(shape)
    if len(data) != numel * dtype.itemsize:
        raise WireError(f"a reply's tensor of shape {shape} and {dtype} carries {len(data)} bytes")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


# ---- calls: the test process to the ranks -----------------------------------------------------------

def dumps(obj) -> bytes:
    """A call's payload: plain pickle when it can, cloudpickle for what pickle cannot name (local classes...)."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return cloudpickle.dumps(obj)


def dump_function(fn) -> bytes:
    """A rank function by value, its code objects keeping their real file names."""
    buffer = io.BytesIO()
    _FunctionPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
    return buffer.getvalue()


class _FunctionPickler(cloudpickle.Pickler):
    def __init__(self, *args, **kwargs):
        ours = {types.CodeType: _code_keeping_its_file}
        torch = sys.modules.get("torch")
        if torch is not None:   # cloudpickle takes any attribute named ``ops`` for the module torch.ops
            ours[type(torch.ops)] = _torch_ops_by_name
        self.dispatch_table = ChainMap(ours, cloudpickle.Pickler.dispatch_table)   # read by __init__ below
        super().__init__(*args, **kwargs)


def _code_keeping_its_file(code: types.CodeType):
    """cloudpickle 3 ships code by value under the file name ``<dynamic-code>``; keep the real one, so
    trace sites, tracebacks and hang reports name ``test_x.py:15`` under every cloudpickle version."""
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return rebuild, tuple(code.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a for a in args)


def _torch_ops_by_name(_ops):
    return importlib.import_module, ("torch.ops",)


def read_frame(conn, deadline: float) -> bytes:
    """One frame of multiprocessing's format (a length header, then that many bytes) from a rank's end of its
    pipe, by ``deadline`` (time.monotonic()).  The rank can write raw bytes there: a forged header naming more
    bytes than follow must not hold the test process past every deadline, as ``recv_bytes`` would.  Raises
    TimeoutError at the deadline, EOFError when the pipe closes, WireError for a header no reply has."""
    fd = conn.fileno()
    size = struct.unpack("!i", _read_exactly(fd, 4, deadline))[0]
    if size == -1:
        size = struct.unpack("!Q", _read_exactly(fd, 8, deadline))[0]
    if not 0 <= size <= MAX_REPLY:
        raise WireError(f"a frame header names {size} bytes")
    return _read_exactly(fd, size, deadline)


def _read_exactly(fd: int, size: int, deadline: float) -> bytes:
    buffer, got = bytearray(size), 0
    while got < size:
        if not readable([fd], max(0.0, deadline - time.monotonic())):
            raise TimeoutError
        chunk = os.read(fd, min(size - got, 1 << 22))
        if not chunk:
            raise EOFError
        buffer[got:got + len(chunk)] = chunk
        got += len(chunk)
    return bytes(buffer)
