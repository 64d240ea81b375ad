"""The judge application: the catalogue, judging a file, reports, and the learner's and instructor's workflows.

It runs every test run in a fresh pytest process with its plugin (kit.plugin) loaded, and reads
only what that process writes back (a JSON report, progress events, trace files).  It uses the
engine (``harness``) only through its public API, and knows no problem by number: whatever is
problem-specific comes from problems.yaml.

Layout, one job per module:
    config      KitConfig: one run's configuration; the one place that reads KIT_* overrides
    catalogue   problems.yaml, validated when loaded
    judging     judge_once(problem, target, config) -> Verdict: one pytest process, scored
    plugin      the pytest plugin (fixtures, each problem's policy); session: its per-process state
    failures    a failure's kind and message in plain words
    report      a Verdict as rich text, JSON or Gradescope results.json; the plain-pytest summary
    show        --trace / --show: timelines and recorded drawings
    progress    the learner's progress and hints
    stubs       the committed stub, --reset
    watch       --watch's loop; warm: WarmTests, its one warm test process; server: that process
    selfcheck   reference passes, stub scores 0, every known-wrong version fails
    grade       a folder of submissions into a gradebook; ray_grade: the same, a Ray task per submission
    live        progress on a terminal
    cli         judge.py's commands
    target_cli  --solution / --target for small scripts beside a problem
    compat      the suite against one torch version, in a fresh venv
    doctor      what this machine has for the kit, which problems run here, the fix for each known problem
    statements  a statement's sections and property list; messages: every message in English and Chinese
    scaffold    judge.py new, and the catalogue's agreement with its files
    notebook    the IPython magics (%%ranks, %judge); timeline_html: --show's page
    speed       where a learner's wait goes: a cold judge by phase, each property, --watch latency
    launch/     python -m kit.launch N: your implementation run for real under torchrun, beside torch's own
"""
