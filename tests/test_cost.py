"""The cost table: each judge run ends with the figures its tests recorded, the model's value beside yours."""
import re

from tests.judge_helpers import judge  # noqa: F401  (fixture)


def test_a_judge_run_ends_with_the_cost_table(judge):
    out = judge(111, "--solution", "-k", "test_bytes_within_ring_bound", "--profile", "quick", "--seed", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    table = out.stdout[out.stdout.index("cost of test_bytes_within_ring_bound"):]
    for line in ("figure", "closed form", "model", "yours", "ratio", "bytes per rank", "busiest link",
                 "messages per rank", "2(N-1) · ceil(numel/N) · elem_size"):
        assert line in table, table
    zh = judge(111, "--solution", "-k", "test_bytes_within_ring_bound", "--profile", "quick", "--seed", "3",
               "--lang", "zh")
    assert "代价：test_bytes_within_ring_bound" in zh.stdout and "指标" in zh.stdout and "比值" in zh.stdout


def test_show_writes_the_timeline_as_a_page_with_the_costs(judge, tmp_path):
    out = judge(111, "--solution", "--show", "-k", "test_bytes_within_ring_bound", "--seed", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    page = (tmp_path / "state" / "timeline-111.html").read_text()   # the judge fixture's state folder
    assert "wrote" in out.stdout and 'class="lane"' in page and "bytes per rank" in page
    assert not re.search(r"""(src|href)=["']?https?:|url\(\s*["']?https?:|@import""", page)   # no network needed


def test_the_chrome_trace_counts_bytes_and_ops_in_flight():
    from harness import CommOp, PhaseSpan, Trace, to_chrome
    ops = [CommOp(rank=0, index=i, kind="all_reduce", name="c10d.allreduce_.default", shapes=[[4]],
                  dtypes=["torch.float32"], in_bytes=16, out_bytes=16, peer=None, group=(0, 1), phase="backward",
                  step=None, site="ddp.py:10", issued_at=start, wait_start=end, wait_end=end, blocking=False)
           for i, (start, end) in enumerate([(0.001, 0.005), (0.002, 0.006)])]
    chrome = to_chrome(Trace(ops_by_rank=[ops], phases_by_rank=[[PhaseSpan(0, "backward", None, 0.0, 0.004)]]))
    counters = [(e["name"], e["ts"], e["args"]) for e in chrome["traceEvents"] if e["ph"] == "C"]
    assert ("bytes sent", 2000.0, {"bytes": 32}) in counters and max(
        a["ops"] for n, _, a in counters if n == "ops in flight") == 2


def test_the_trace_file_carries_the_cost_figures(judge, tmp_path):
    import json
    out = judge(111, "--solution", "--trace", tmp_path / "t.json", "-k", "test_bytes_within_ring_bound", "--seed", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    chrome = json.loads((tmp_path / "t.json").read_text())
    figures = {e["name"] for e in chrome["traceEvents"] if e["ph"] == "C" and e["pid"] == "cost"}
    assert {"bytes per rank", "busiest link", "messages per rank"} <= figures, figures


def test_gradescope_results_carry_a_leaderboard_of_the_cost_figures(judge, tmp_path):
    import json
    results = tmp_path / "results.json"
    out = judge(111, "--solution", "-k", "test_bytes_within_ring_bound", "--profile", "quick", "--seed", "3",
                "--format", "gradescope", "--output", results)
    assert out.returncode == 0, out.stdout + out.stderr
    board = {e["name"]: e for e in json.loads(results.read_text())["leaderboard"]}
    # Gradescope's documented entry: a name, a number, and "asc" where lower ranks first
    assert set(board) == {"bytes per rank / model", "busiest link / model", "messages per rank / model"}, board
    assert all(e["order"] == "asc" and e["value"] == 1.0 for e in board.values()), board   # the ring is the model
