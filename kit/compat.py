"""Measure the kit on one torch version: a fresh clone, a fresh venv, the whole suite on the reference.

    python -m kit.compat --torch 2.4.1 [--profile quick|default|thorough] [--source DIR] [--keep]
                             [-- extra pytest args]

Clones the committed HEAD of this kit (or of the git repository --source), makes a virtual
environment with no system site-packages, installs ``torch==<version>`` first and then the kit
(``pip install -e .``, the README's install with the chosen torch), and runs
``python -m pytest --solution -n auto --kit-profile <profile>``.
It ends with one markdown row for the README's table of supported versions:

    | torch | python | profile | result | tests' wall time | date | commit |

and exits with pytest's exit code (or the failing install step's). Standalone: nothing in the
kit imports it.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _step(cmd: list[str], **kwargs) -> int:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kwargs).returncode


def _summary(output: str) -> str:
    """'N passed, M failed' (then errors, skipped...) from pytest's last '=== ... in 12.3s ===' line."""
    lines = [line for line in output.splitlines() if re.match(r"=+ .* in [\d.]+s", line)]
    plural = {"errors": "error", "warnings": "warning"}
    counts = {plural.get(word, word): int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[-1] if lines else "")}
    parts = [f"{counts.pop('passed', 0)} passed", f"{counts.pop('failed', 0)} failed"]
    return ", ".join(parts + [f"{n} {word}" for word, n in counts.items() if word != "warning"])


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"


def measure(version: str, profile: str, source: str, extra: list[str], work: str) -> int:
    kit, venv = os.path.join(work, "kit"), os.path.join(work, "venv")
    python = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""))
    for cmd, cwd in ((["git", "clone", "--quiet", "--no-hardlinks", source, kit], work),
                     ([sys.executable, "-m", "venv", venv], work),
                     ([python, "-m", "pip", "install", "--quiet", f"torch=={version}"], kit),
                     ([python, "-m", "pip", "install", "--quiet", "-e", "."], kit)):
        code = _step(cmd, cwd=cwd, env=env)
        if code:
            print(f"compat: step failed with exit code {code}: {' '.join(cmd)}", file=sys.stderr)
            return code
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=kit, capture_output=True,
                            text=True).stdout.strip()
    versions = subprocess.run([python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                              cwd=kit, env=env, capture_output=True, text=True).stdout.split()
    py_version, torch_version = versions if len(versions) == 2 else ("?", "?")

    cmd = [python, "-m", "pytest", "--solution", "-n", "auto", "--kit-profile", profile, *extra]
    print("$", " ".join(cmd), flush=True)
    start, output = time.monotonic(), []
    # SIGINT as a terminal gives it, even when this was started with `&` (which ignores SIGINT, and
    # children inherit that): the suite's Ctrl-C tests need it
    with subprocess.Popen(cmd, cwd=kit, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        for line in proc.stdout:   # shown as it comes, kept for the summary
            sys.stdout.write(line)
            output.append(line)
    wall = time.monotonic() - start
    date = datetime.date.today().isoformat()
    print(f"| {torch_version} | {py_version} | {profile} | {_summary(''.join(output))} | {_minutes(wall)} "
          f"| {date} | {commit} |", flush=True)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m kit.compat", description=__doc__.split("\n")[0])
    parser.add_argument("--torch", required=True, metavar="VERSION", help="e.g. 2.4.1 (installed as torch==VERSION)")
    parser.add_argument("--profile", default="default", choices=["quick", "default", "thorough"])
    parser.add_argument("--source", default=KIT, help="git repository whose HEAD is measured (default: this kit)")
    parser.add_argument("--keep", action="store_true", help="keep the clone and the venv, and say where")
    args = parser.parse_args(own)
    work = tempfile.mkdtemp(prefix=f"kit-compat-{args.torch}-")
    try:
        return measure(args.torch, args.profile, os.path.abspath(args.source), extra, work)
    except KeyboardInterrupt:
        return 2
    finally:
        if args.keep:
            print(f"compat: kept {work} (activate with . {work}/venv/bin/activate)", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
