"""What a call may issue, and the fingerprint of its op records: shared by the test process and the ranks.

The test process builds a ``Policy`` for each call and ships it to the ranks; the rank's recorder
refuses an op it forbids as the op is issued, and the test process checks every streamed record
against the same policy afterwards.  ``ops_digest`` fingerprints op records the same way on both
sides.  Nothing here imports torch, so the test process can use it before torch is loaded.
"""
from __future__ import annotations

import hashlib
import json

from ..errors import ForbiddenOp
from ..trace import COLLECTIVE_KINDS, P2P_KINDS

_KNOWN_KINDS = frozenset(COLLECTIVE_KINDS + P2P_KINDS)


class Policy:
    """What a call may issue, and what the ranks run around it.

    ``forbid`` / ``allow`` name op kinds (``allow`` wins when given).  ``rank_parts``: the rank-side
    parts of the call's probes (``harness.probes``), entered around the rank function.
    ``default_device``: where tensors made without a device land while the rank function runs
    (``"meta"`` in the device audit; None: torch's default).
    """

    def __init__(self, forbid=(), allow=None, rank_parts=(), default_device: str | None = None):
        self.forbid = frozenset(forbid)
        self.allow = None if allow is None else frozenset(allow)
        unknown = sorted((self.forbid | (self.allow or frozenset())) - _KNOWN_KINDS)
        if unknown:   # a typo ("allreduce") would otherwise forbid nothing, silently
            raise ValueError(f"unknown op kind(s) {', '.join(map(repr, unknown))}; "
                             f"the kinds are: {', '.join(sorted(_KNOWN_KINDS))}")
        self.rank_parts = tuple(rank_parts)
        self.default_device = default_device
        self.refused = None   # the first refusal's message: the call fails even if the code catches it

    def check(self, kind: str, site: str):
        refused = kind in self.forbid or (self.allow is not None and kind not in self.allow)
        if refused:
            allowed = sorted(self.allow) if self.allow is not None else None
            hint = f" Allowed here: {', '.join(allowed)}." if allowed else ""
            self.refuse(f"{kind} is not allowed in this problem (called at {site}).{hint}")

    def refuse(self, message: str):
        if self.refused is None:
            self.refused = message
        raise ForbiddenOp(message)


def ops_digest(ops: list) -> str:
    """A fingerprint of op records: a rank's own (``Recorder.digest``), or each op's last streamed form.

    The two agree unless code in the rank edited its recorder's records after streaming them; the
    rank's op-count check reads those records, so the test process can compare the two fingerprints.
    """
    return hashlib.sha256(json.dumps(ops, sort_keys=True).encode()).hexdigest()
