"""kit.timeline_html in a real headless Chromium: the page it renders from a real harness call's trace.

The browser dumps the DOM it built (parsed here with html.parser) and takes a screenshot (checked from the
PNG's own bytes).  Without a Chromium on PATH these tests are skipped; on Debian, as root:
``apt-get update && apt-get install -y chromium``.
"""
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import zlib
from html.parser import HTMLParser

import pytest
import torch
import torch.distributed as dist

import harness
from kit.timeline_html import analyse, render_html

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(BROWSER is None, reason="no Chromium on PATH for the headless-browser checks: "
                                "install it with `apt-get update && apt-get install -y chromium` (Debian, as root)")


def one_step():
    """forward, backward (an async all_reduce of 4 KiB and a ring isend/irecv of 1 KiB issued in it), step;
    the ops are waited for only after backward ends, outside every phase: exposed communication."""
    rank, world = dist.get_rank(), dist.get_world_size()
    grad, out, into = torch.ones(1024), torch.full((256,), float(rank)), torch.empty(256)
    with harness.phase("forward"):
        x = torch.randn(64, 64) @ torch.randn(64, 64)
    with harness.phase("backward"):
        works = [dist.all_reduce(grad, async_op=True), dist.isend(out, (rank + 1) % world),
                 dist.irecv(into, (rank - 1) % world)]
        x = x @ x
    time.sleep(0.005)
    for work in works:
        work.wait()
    with harness.phase("step"):
        x.add_(1)
    return into[0].item()


def pipeline_forward():
    """Three stages, two micro-batches, forwards then backwards: each stage idles while it waits for its
    neighbour (blocking recv outside any phase), so each lane has a bubble."""
    rank, world = dist.get_rank(), dist.get_world_size()
    act = torch.zeros(8)
    for mb in range(2):
        if rank > 0:
            dist.recv(act, rank - 1)
        with harness.phase("F", step=mb):
            time.sleep(0.01)
        if rank < world - 1:
            dist.send(act, rank + 1)
    for mb in range(2):
        if rank < world - 1:
            dist.recv(act, rank + 1)
        with harness.phase("B", step=mb):
            time.sleep(0.01)
        if rank > 0:
            dist.send(act, rank - 1)


class Dom(HTMLParser):
    """Every element of the dumped DOM as {tag, attrs, parent, text (its own and its descendants')}."""

    VOID = {"meta", "br", "hr", "img", "input", "link"}

    def __init__(self, html: str):
        super().__init__()
        self.elements, self.stack = [], []
        self.feed(html)

    def handle_starttag(self, tag, attrs, closed=False):
        el = {"tag": tag, "attrs": dict(attrs), "parent": self.stack[-1] if self.stack else None, "text": ""}
        self.elements.append(el)
        if not closed and tag not in self.VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs, closed=True)

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def of_class(self, cls, inside=None):
        return [e for e in self.elements if cls in e["attrs"].get("class", "").split()
                and (inside is None or self.within(e, inside))]

    def within(self, el, ancestor):
        while el is not None and el is not ancestor:
            el = el["parent"]
        return el is ancestor

    def label(self, box):
        return next(e["text"] for e in self.elements if e["tag"] == "text" and e["parent"] is box)


def chromium(*args, timeout=40):
    """Runs headless Chromium on its own throwaway profile; kills its whole process group if it hangs."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = None, f"chromium did not finish within {timeout} s: {' '.join(cmd)}"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)    # the browser's own group: its helpers too
            except ProcessLookupError:
                pass
            proc.communicate()
    assert out is not None and proc.returncode == 0, err[-3000:]
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    result = harness.run(one_step, 3, timeout=30)
    assert result.values == [2.0, 0.0, 1.0]
    chrome = harness.to_chrome(result.trace)
    path = tmp_path_factory.mktemp("timeline") / "one_step.html"
    costs = [{"figure": "exposed comm", "model": "0.10 ms", "yours": 0.25, "ratio": "2.5x <slow>"}]
    path.write_text(render_html(chrome, "one step <on 3 ranks>", costs))
    return chrome, path


@needs_chromium
def test_the_dumped_dom_holds_every_lane_op_phase_and_exposed_mark(page):
    chrome, path = page
    dom = Dom(chromium("--dump-dom", path.as_uri()))
    assert not [e for e in dom.elements if e["tag"] == "script" or "http" in e["attrs"].get("src", "")]
    assert [e["text"] for e in dom.elements if e["tag"] == "h1"] == ["one step <on 3 ranks>"]
    lanes = dom.of_class("lane")
    assert [lane["attrs"]["data-rank"] for lane in lanes] == ["0", "1", "2"]
    view = analyse(chrome)
    for rank, lane in enumerate(lanes):
        ops = dom.of_class("op", inside=lane)
        assert sorted(op["attrs"]["data-kind"] for op in ops) == ["all_reduce", "recv", "send"]
        labels = {op["attrs"]["data-kind"]: dom.label(op) for op in ops}
        assert labels["all_reduce"] == "all_reduce 4.0 KiB"
        assert labels["send"] == f"send 1.0 KiB → r{(rank + 1) % 3}" and labels["recv"] == f"recv ← r{(rank - 1) % 3}"
        phases = [p["attrs"]["data-name"] for p in dom.of_class("phase", inside=lane)]
        assert phases == ["forward", "backward", "step"]
        assert view["ranks"][rank]["exposed_total"] >= 4000          # µs: the 5 ms sleep before the waits
        exposed = dom.of_class("exposed", inside=lane)
        assert {e["parent"]["attrs"]["data-kind"] for e in exposed} == {"all_reduce", "send", "recv"}
    legend = dom.of_class("legend-exposed")[0]["text"]
    assert all(f"rank {r} " in legend for r in range(3)), legend
    table = next(e for e in dom.elements if e["tag"] == "table")
    assert "exposed comm" in table["text"] and "2.5x <slow>" in table["text"] and "0.25" in table["text"]


@needs_chromium
def test_the_screenshot_is_a_picture_of_the_window_size(page, tmp_path):
    _, path = page
    shot = tmp_path / "x.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,900", path.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (1400, 900)
    idat, at = b"", 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        idat += data[at + 8:at + 8 + length] if kind == b"IDAT" else b""
        at += 12 + length
    pixels = zlib.decompress(idat)
    assert len(set(pixels)) > 32, "the screenshot is (nearly) one colour: the page drew nothing"


@needs_chromium
def test_a_pipeline_trace_shades_its_bubbles_and_prints_the_fraction(tmp_path):
    chrome = harness.to_chrome(harness.run(pipeline_forward, 3, timeout=30).trace)
    view = analyse(chrome)
    assert 0.1 < view["bubble_fraction"] < 0.95, view["bubble_fraction"]
    path = tmp_path / "pipeline.html"
    path.write_text(render_html(chrome, "pipeline"))
    dom = Dom(chromium("--dump-dom", path.as_uri()))
    lanes = dom.of_class("lane")
    assert [lane["attrs"]["data-rank"] for lane in lanes] == ["0", "1", "2"]
    for rank, lane in enumerate(lanes):
        assert len(dom.of_class("phase", inside=lane)) == 4
        assert len(dom.of_class("bubble", inside=lane)) == len(view["ranks"][rank]["bubbles"]) >= 1
    legend = dom.of_class("legend-bubble")[0]["text"]
    shown = re.search(r"bubble fraction ([0-9.]+)%", legend)
    assert shown and float(shown.group(1)) == pytest.approx(100 * view["bubble_fraction"], abs=0.051), legend


def test_bubble_and_exposed_arithmetic_on_a_hand_made_trace():
    x = lambda pid, tid, name, ts, dur, **args: {"ph": "X", "pid": pid, "tid": tid, "name": name,  # noqa: E731
                                                 "ts": ts, "dur": dur, "args": args}
    chrome = {"traceEvents": [x(0, 0, "forward", 0, 100), x(0, 0, "backward", 200, 100), x(0, 0, "step", 350, 50),
                              x(0, 1, "all_reduce", 250, 120, bytes=4096), x(0, 2, "all_reduce", 260, 20, bytes=8)]}
    view = analyse(chrome)
    rank = view["ranks"][0]
    assert rank["bubbles"] == [(100, 200), (300, 350)] and view["bubble_fraction"] == pytest.approx(150 / 400)
    assert rank["op_tracks"] == [0, 1] and rank["exposed"] == [[(300, 370)], []] and rank["exposed_total"] == 70
    assert analyse(chrome, exposed_after=None)["ranks"][0]["exposed"] == [[(300, 350)], []]
