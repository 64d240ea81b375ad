"""A statement's contract code, run as the statement writes it, with the stub and with the reference.

A learner copies these lines; the stub and the reference must work with them as they stand.
"""
import os
import re

import pytest

import harness
from kit import catalogue

GRADIENT_COMPRESSION = catalogue.load()[126]


def contract_lines(problem, starts: str) -> list:
    """The lines of the statement's first python block (its contract) that start with ``starts``."""
    text = open(os.path.join(os.path.dirname(problem.practice_file()), "README.md"), encoding="utf-8").read()
    block = re.search(r"^```python\n(.*?)^```", text, re.M | re.S).group(1)
    return [line for line in block.splitlines() if line.startswith(starts)]


def _register(target, line: str, stub: bool):
    """Runs on one rank: a DDP model, then the statement's registration line, executed as written."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    names = dict(vars(target.load()))
    if stub:   # a stub's state raises NotImplementedError by design: what DDP checks here is the hook
        names.update(BF16State=lambda *args, **kwargs: None, PowerSGDState=lambda *args, **kwargs: None)
    ddp = DistributedDataParallel(torch.nn.Linear(3, 2).to(harness.device()))
    exec(line, {**names, "ddp": ddp, "torch": torch, "process_group": None, "r": 2, "s": 0})
    return True


@pytest.mark.parametrize("which", ["stub", "reference"])
@pytest.mark.parametrize("line", contract_lines(GRADIENT_COMPRESSION, "ddp.register_comm_hook("))
def test_126_hooks_register_with_ddp_as_the_statement_writes(which, line):
    """#30: registering the reference's powersgd_hook as the README shows raised "return annotation should be
    torch.futures.Future[torch.Tensor]" (the stub's annotation and ``from __future__ import annotations``)."""
    problem = GRADIENT_COMPRESSION
    path = problem.practice_file() if which == "stub" else problem.solution_file()
    assert harness.run(_register, 1, harness.Target(path, problem.names), line, which == "stub",
                       timeout=60).values == [True]
