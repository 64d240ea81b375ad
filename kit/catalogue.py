"""problems.yaml: the one catalogue of problems, validated when it is loaded."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .config import ROOT

CATALOGUE = os.path.join(ROOT, "problems.yaml")

_REQUIRED = {"number", "slug", "title", "difficulty", "topic", "file", "names"}
_OPTIONAL = {"title_zh", "hints_zh", "cost", "forbidden_ops", "allowed_ops", "time_limit", "points", "hints", "trace_test", "show",
             "max_world_size", "probes", "stand_ins"}
PROBES = ("compute", "flops")   # what every call of a problem's tests may measure (the plugin makes them)
_DIFFICULTIES = ("easy", "medium", "hard")
_OP_KINDS = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier",
             "reduce", "gather", "scatter", "send", "recv"}


class CatalogueError(Exception):
    """problems.yaml is malformed; the message says where and how."""


@dataclass(frozen=True)
class Problem:
    number: int
    slug: str
    title: str
    difficulty: str
    topic: str
    file: str
    names: tuple
    title_zh: str = ""
    forbidden_ops: tuple = ()
    allowed_ops: tuple | None = None
    time_limit: float = 5.0
    points: dict = field(default_factory=dict)
    hints: tuple = ()
    hints_zh: tuple = ()   # the hints in Chinese, one for each of ``hints``
    cost: dict = field(default_factory=dict)   # the cost model: figure name -> its closed form (the statement's)
    trace_test: str = ""   # the test whose last case --trace/--show records
    show: str = ""         # the test whose recorded drawing --show prints (record_property("drawing", text))
    max_world_size: int = 4   # the largest world its tests start: NCCL needs that many GPUs
    probes: tuple = ()        # what every call of its tests measures (PROBES): the calls look alike to the ranks
    stand_ins: tuple = ()     # torch's own implementations of what the problem asks for (refused in the ranks)

    @property
    def folder(self) -> str:
        return f"{self.number}_{self.slug}"

    def practice_file(self, root: str = ROOT) -> str:
        return os.path.join(root, "practice", self.folder, self.file)

    def solution_file(self, root: str = ROOT) -> str:
        return os.path.join(root, "solutions", self.folder, self.file)

    def tests_dir(self, tests_root: str | None = None) -> str:
        return os.path.join(tests_root or os.path.join(ROOT, "practice"), self.folder)

    def wrong_files(self, root: str = ROOT) -> list:
        folder = os.path.join(root, "solutions", self.folder, "wrong")
        if not os.path.isdir(folder):
            return []
        return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))

    def alternate_files(self, root: str = ROOT) -> list:
        """Correct but unusual solutions (tests/alternates/<folder>/): every test must accept each of them."""
        folder = os.path.join(root, "tests", "alternates", self.folder)
        if not os.path.isdir(folder):
            return []
        return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))

    def points_for(self, test_name: str) -> float:
        return float(self.points.get(test_name.split("[")[0], 1))

    def title_in(self, lang: str) -> str:
        """The title in ``lang`` (English where the catalogue has none in it)."""
        return self.title_zh if lang == "zh" and self.title_zh else self.title

    def hints_in(self, lang: str) -> tuple:
        return self.hints_zh if lang == "zh" and self.hints_zh else self.hints

    def readme(self, lang: str) -> str:
        """The statement's file name in ``lang``."""
        return "README.zh.md" if lang == "zh" else "README.md"


def load(path: str = CATALOGUE) -> dict:
    """number -> Problem.  Raises CatalogueError naming the entry and the field at fault."""
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise CatalogueError(f"{path} not found") from None
    except yaml.YAMLError as e:
        raise CatalogueError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("problems"), list):
        raise CatalogueError(f"{path} must be a mapping with a 'problems:' list")
    problems = {}
    for i, entry in enumerate(data["problems"]):
        where = f"{os.path.basename(path)}, entry {i + 1}"
        if not isinstance(entry, dict):
            raise CatalogueError(f"{where}: each problem must be a mapping")
        if "number" in entry:
            where += f" (problem {entry['number']})"
        unknown = set(entry) - _REQUIRED - _OPTIONAL
        if unknown:
            raise CatalogueError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_REQUIRED | _OPTIONAL))}")
        missing = _REQUIRED - set(entry)
        if missing:
            raise CatalogueError(f"{where}: missing {', '.join(sorted(missing))}")
        if not isinstance(entry["number"], int):
            raise CatalogueError(f"{where}: number must be an integer")
        if entry["number"] in problems:
            raise CatalogueError(f"{where}: duplicate problem number {entry['number']}")
        if entry["difficulty"] not in _DIFFICULTIES:
            raise CatalogueError(f"{where}: difficulty must be one of {', '.join(_DIFFICULTIES)}")
        for key in ("forbidden_ops", "allowed_ops"):
            bad = set(entry.get(key) or ()) - _OP_KINDS
            if bad:
                raise CatalogueError(f"{where}: {key} has unknown op kinds {', '.join(sorted(bad))}; "
                                     f"known: {', '.join(sorted(_OP_KINDS))}")
        if not isinstance(entry.get("max_world_size", 4), int) or not 1 <= entry.get("max_world_size", 4) <= 64:
            raise CatalogueError(f"{where}: max_world_size must be an integer from 1 to 64")
        bad = set(entry.get("probes") or ()) - set(PROBES)
        if bad:
            raise CatalogueError(f"{where}: probes has unknown names {', '.join(sorted(bad))}; known: {', '.join(PROBES)}")
        if not isinstance(entry.get("points", {}), dict):
            raise CatalogueError(f"{where}: points must map test names to numbers")
        if not isinstance(entry.get("cost", {}), dict):
            raise CatalogueError(f"{where}: cost must map figure names to their closed forms")
        if entry.get("hints_zh") and len(entry["hints_zh"]) != len(entry.get("hints") or ()):
            raise CatalogueError(f"{where}: hints_zh has {len(entry['hints_zh'])} hints, hints has "
                                 f"{len(entry.get('hints') or ())}: one translation for each")
        problem = Problem(
            number=entry["number"], slug=str(entry["slug"]), title=str(entry["title"]),
            difficulty=entry["difficulty"], topic=str(entry["topic"]), file=str(entry["file"]),
            names=tuple(entry["names"]), title_zh=str(entry.get("title_zh", "")),
            forbidden_ops=tuple(entry.get("forbidden_ops") or ()),
            allowed_ops=tuple(entry["allowed_ops"]) if entry.get("allowed_ops") else None,
            time_limit=float(entry.get("time_limit", 5.0)), points=dict(entry.get("points") or {}),
            hints=tuple(entry.get("hints") or ()), hints_zh=tuple(entry.get("hints_zh") or ()),
            cost={str(k): str(v) for k, v in (entry.get("cost") or {}).items()}, trace_test=str(entry.get("trace_test", "")),
            show=str(entry.get("show", "")), max_world_size=entry.get("max_world_size", 4),
            probes=tuple(entry.get("probes") or ()), stand_ins=tuple(entry.get("stand_ins") or ()))
        for kind, file in (("stub", problem.practice_file()), ("reference", problem.solution_file())):
            if os.path.dirname(path) == ROOT and not os.path.isfile(file):
                raise CatalogueError(f"{where}: its {kind} {os.path.relpath(file, ROOT)} does not exist")
        problems[problem.number] = problem
    return problems


def problem_for_path(path: str, problems: dict) -> Problem | None:
    """The problem a test file belongs to, from its folder name ``<number>_<slug>`` (or ``<number>``)."""
    for part in reversed(os.path.normpath(os.path.abspath(path)).split(os.sep)):
        head = part.split("_", 1)[0]
        if head.isdigit() and int(head) in problems:
            return problems[int(head)]
    return None
