"""What a rank is started with (``RankSetup``), and the folders and ids the test process prepares for it.

One object per rank, built once by the world and handed to the rank process at its start: where its
stderr, stack dump and private folder are, the store's file, the shared folder if any, what it may
not read, whether Landlock is used, and the uid and gid it runs as (``sandbox.identity``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..sandbox import identity


@dataclass(frozen=True)
class SandboxSpec:
    """How a world's ranks are confined: what they may not read, and whether Landlock is used."""
    hidden: tuple = ()        # folders and files the ranks may not read (the kit's answers, its tests)
    landlock: bool = True     # False: behave as on a kernel without Landlock (tests of the fallback)
    memory_gb: float | None = None   # what a rank may allocate beyond what it holds at start (RLIMIT_DATA)


@dataclass(frozen=True)
class RankSetup:
    rank: int
    world_size: int
    backend: str
    store: str                # the FileStore's file
    stderr: str
    stack: str
    tmp: str                  # the rank's private folder
    shared: str | None = None  # a folder every rank of the world may read and write
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    ids: tuple | None = None  # (uid, gid, read_anything) the rank runs as (``identity``), or None: the judge's
    ids_note: str = ""        # why the rank runs as the judge's uid, when it does


def prepare_world(folder: str, world_size: int, backend: str, shared: str | None,
                  sandbox: SandboxSpec) -> tuple[list, str]:
    """Each rank's setup in a fresh world folder, with files and folders made ready for the ranks' ids;
    and why the ranks run as their own uids or not."""
    os.chmod(folder, 0o711)   # ranks of another uid may reach their own folder and the store, not list them
    store = os.path.join(folder, "store")
    ids, why = identity.rank_ids(world_size, folder)
    setups = []
    for r in range(world_size):
        files = {k: os.path.join(folder, f"rank{r}.{k}") for k in ("stderr", "stack", "tmp")}
        if ids is not None:
            identity.prepare_private(files["tmp"], ids.uids[r], ids.gid)
        setups.append(RankSetup(r, world_size, backend, store, shared=shared, sandbox=sandbox,
                                ids=(ids.uids[r], ids.gid, ids.read_anything) if ids is not None else None,
                                ids_note=why, **files))
    if ids is not None:
        with open(store, "ab"):
            pass
        identity.prepare_shared(store, ids.gid, directory=False)
        if shared is not None:
            identity.prepare_shared(shared, ids.gid, directory=True)
    return setups, why
