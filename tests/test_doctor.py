"""judge.py doctor: what it says of this machine matches what the machine is, and each known problem has its fix."""
import importlib.metadata
import io
import os
import re

import harness
from kit import catalogue, cli, doctor
from kit.config import KitConfig
from kit.doctor import KNOWN_PROBLEMS, Facts, GlooCheck
from tests import judge_helpers

judge = judge_helpers.judge   # the fixture: judge.py run as a learner runs it

HEALTHY_LINUX = dict(platform="linux", torch="2.13.0+cpu", distributed=True, backends=("gloo",), libuv="yes",
                     protections={"landlock": "ABI 7", "sealed": True, "missing": []}, check=GlooCheck(True))


def test_doctor_reports_this_machine_its_protections_and_every_problem(judge):
    out = judge("doctor", timeout=120)
    assert out.returncode == cli.EXIT_PASS, out.stdout + out.stderr
    text = out.stdout
    assert importlib.metadata.version("torch") in text
    assert re.search(rf"^  cores\s+{os.cpu_count()}$", text, re.M), text
    assert re.search(r"^  2-rank check\s+ok: all_reduce on 2 ranks in [\d.]+ s", text, re.M), text
    here = harness.protections_here()
    missing = {m.split(":")[0] for m in here["missing"]}
    for measure, state in here.items():
        if measure not in ("sealed", "missing"):
            said = "missing" if measure in missing else "in force"
            assert re.search(rf"^  {measure}\s+{said}\s+{re.escape(state)}$", text, re.M), (measure, text)
    assert ("sealed: every protection is in force" in text) == here["sealed"]
    for number, problem in catalogue.load().items():
        assert re.search(rf"^  {number} {problem.slug}\s+up to {problem.max_world_size}\s", text, re.M), number
    assert text.rstrip().endswith("ready: the problems run here on gloo")


def test_macos_and_windows_each_have_their_fix():
    assert len({k.name for k in KNOWN_PROBLEMS}) == len(KNOWN_PROBLEMS)
    for known in KNOWN_PROBLEMS:
        assert known.problem and known.fix, known.name
    fixes = {platform: " ".join(k.fix for k in KNOWN_PROBLEMS if k.applies(Facts(platform=platform)))
             for platform in ("darwin", "win32")}
    assert "GLOO_SOCKET_IFNAME=lo0" in fixes["darwin"]
    assert "WSL2" in fixes["win32"]
    assert not [k.name for k in KNOWN_PROBLEMS if k.applies(Facts(**HEALTHY_LINUX))]


def test_the_harness_gives_its_ranks_the_loopback_interface_on_macos_only():
    from harness.world.rank import gloo_environment
    assert gloo_environment("darwin") == {"GLOO_SOCKET_IFNAME": "lo0"}
    assert gloo_environment("linux") == {} and gloo_environment("win32") == {}


def test_a_machine_where_gloo_fails_is_not_ready_and_says_the_fix(monkeypatch):
    broken = Facts(**dict(HEALTHY_LINUX, check=GlooCheck(False, "RuntimeError: Unable to find address for: vm")))
    out = io.StringIO()
    doctor.render(broken, catalogue.load(), out=out)
    assert "FAILED: RuntimeError: Unable to find address for: vm" in out.getvalue()
    assert "export GLOO_SOCKET_IFNAME=lo" in out.getvalue() and "NOT ready" in out.getvalue()
    monkeypatch.setattr(doctor, "gather", lambda config: broken)
    monkeypatch.setattr(doctor, "render", lambda facts, problems: None)
    assert doctor.doctor({}, KitConfig()) == cli.EXIT_FAIL
