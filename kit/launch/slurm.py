"""torchrun's arguments from a SLURM job step's variables, for a launch given no torchrun arguments.

SLURM starts one task per node (``srun --ntasks-per-node=1``); each runs ``python -m kit.launch``,
whose torchrun starts that node's ranks and meets the other nodes' at the job's first host:

    SLURM_NNODES                  -> --nnodes
    SLURM_NODEID                  -> --node-rank
    SLURM_JOB_NODELIST's 1st host -> --rdzv-endpoint HOST:PORT (--rdzv-backend c10d, --rdzv-id SLURM_JOB_ID)
    SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE -> --nproc-per-node

The ranks per node are the node's GPUs when the job has any (one rank per GPU), else the tasks per
node the job asked for.  PORT is MASTER_PORT when set, else ``DEFAULT_PORT``.
"""
from __future__ import annotations

import re
import shutil
import subprocess

DEFAULT_PORT = 29500


def torchrun_args(env, hostnames=None) -> list | None:
    """torchrun's arguments for the SLURM job step ``env`` describes, or None outside SLURM.

    ``hostnames(nodelist)`` expands a node list (``scontrol show hostnames``); without it, a simple
    parse of the list's first entry (``first_host``)."""
    if "SLURM_JOB_NODELIST" not in env or "SLURM_NNODES" not in env:
        return None
    nodelist = env["SLURM_JOB_NODELIST"]
    host = (hostnames(nodelist) if hostnames else [first_host(nodelist)])[0]
    per_node = _leading_int(env.get("SLURM_GPUS_ON_NODE")) or _leading_int(env.get("SLURM_NTASKS_PER_NODE")) or 1
    return ["--nnodes", str(int(env["SLURM_NNODES"])), "--node-rank", str(int(env.get("SLURM_NODEID", 0))),
            "--nproc-per-node", str(per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:{env.get('MASTER_PORT', DEFAULT_PORT)}",
            "--rdzv-id", env.get("SLURM_JOB_ID", "kit-launch")]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[07-09,12],cpu3`` -> ``gpu07``, ``r[1-2]-n[3-4]`` -> ``r1-n3``."""
    entry = re.match(r"(?:[^,\[]|\[[^\]]*\])*", nodelist.strip()).group(0)   # up to the first comma outside [...]
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], entry)   # each range's first, padding kept


def scontrol_hostnames(nodelist: str) -> list:
    """``scontrol show hostnames NODELIST`` (SLURM's own expansion)."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def hostnames_here():
    """SLURM's expansion when ``scontrol`` is on PATH, else None (``torchrun_args`` parses the list itself)."""
    return scontrol_hostnames if shutil.which("scontrol") else None


def _leading_int(value) -> int:
    """``"4"`` -> 4, ``"2(x3)"`` (SLURM's compressed form) -> 2, None or "" -> 0."""
    match = re.match(r"\d+", value or "")
    return int(match.group(0)) if match else 0
