"""One run's configuration, and the one place that reads the user's environment overrides.

judge.py builds a ``KitConfig`` from its command line and hands it to the pytest run as
``--kit-*`` options; plain ``pytest`` builds the same object from those options' defaults.
Nothing else in the kit reads ``KIT_*`` variables.

User-facing overrides (documented in the README):

    KIT_PROFILE=quick|default|thorough    examples per property, when no --kit-profile is given
    KIT_TARGET=FILE|solution              the code under test, when neither --target nor --solution is given
    KIT_BACKEND=gloo|nccl|auto            the process-group backend of the problems' ranks
    KIT_STATE_DIR=DIR                     where progress, hints and --reset backups live (default .kit/)
    KIT_RANK_MEMORY_GB=N                  each rank's resident-memory limit
    KIT_LANG=en|zh                        the language of what the judge says, when no --lang is given
                                          (else the locale: LC_ALL, LC_MESSAGES or LANG starting "zh")
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = {"quick": 10, "default": 50, "thorough": 500}   # hypothesis examples per property
BACKENDS = ("gloo", "nccl", "auto")
LANGS = ("en", "zh")


def _environment(name: str, default=None):
    value = os.environ.get(name, "").strip()
    return value or default


def language() -> str:
    """KIT_LANG, else the locale's language where it is Chinese, else English."""
    chosen = _environment("KIT_LANG")
    if chosen:
        return chosen
    locale = next((v for v in (_environment(n) for n in ("LC_ALL", "LC_MESSAGES", "LANG")) if v), "")
    return "zh" if locale.lower().startswith("zh") else "en"


@dataclass(frozen=True)
class KitConfig:
    profile: str = field(default_factory=lambda: _environment("KIT_PROFILE", "default"))
    shrink: bool = True                  # selfcheck needs only "it fails", not the smallest case
    verbose: bool = False                # keep hypothesis's own advice under each failure
    backend: str = field(default_factory=lambda: _environment("KIT_BACKEND", "gloo"))
    target: str | None = field(default_factory=lambda: _environment("KIT_TARGET"))
    state_dir: str = field(default_factory=lambda: _environment("KIT_STATE_DIR", os.path.join(ROOT, ".kit")))
    world_size: int | None = None       # run only the examples whose worlds have this many ranks (gpucheck)
    landlock: bool = True               # False: confine the ranks as on a kernel without Landlock (--no-landlock)
    lang: str = field(default_factory=language)   # what the judge says is in this language (messages.py)
    rank_memory_gb: float | None = field(
        default_factory=lambda: float(_environment("KIT_RANK_MEMORY_GB")) if _environment("KIT_RANK_MEMORY_GB")
        else None)

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}: choose one of {', '.join(PROFILES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.lang not in LANGS:
            raise ValueError(f"unknown language {self.lang!r}: choose one of {', '.join(LANGS)}")

    @property
    def examples(self) -> int:
        return PROFILES[self.profile]

    def pytest_args(self) -> list[str]:
        """The options that carry this configuration into a pytest run (kit/plugin.py reads them)."""
        args = ["--kit-profile", self.profile, "--kit-backend", self.backend]
        if not self.shrink:
            args.append("--kit-no-shrink")
        if self.verbose:
            args.append("--kit-verbose")
        if self.rank_memory_gb is not None:
            args += ["--kit-rank-memory-gb", str(self.rank_memory_gb)]
        if self.world_size is not None:
            args += ["--kit-world-size", str(self.world_size)]
        if not self.landlock:
            args.append("--kit-no-landlock")
        return args
