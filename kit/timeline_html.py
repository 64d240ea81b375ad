"""A call's timeline as one self-contained HTML page: inline SVG and CSS, no script, nothing from the network.

``render_html(chrome, title, costs)`` draws the Chrome trace-event JSON that ``harness.to_chrome`` makes:
per rank a compute row (the marked phases) and communication tracks (one box per op, from its issue to the
end of its wait; ops in flight at once on tracks of their own), the bubble (time between a rank's first phase
start and last phase end that no phase covers, hatched grey), exposed communication (red, the same rule as
``kit.show.render_lanes``: what runs after the rank's last ``backward`` phase ends), a time axis in ms,
a legend with the bubble fraction and each rank's exposed time, and optionally a table of costs.
Hovering a box shows its details (SVG ``<title>``, no JavaScript).
"""
from __future__ import annotations

from html import escape

ROW, GAP, LEFT, PLOT = 20, 4, 130, 1100          # px: row height, gap between rows, label column, plot width
PHASE_COLOURS = ["#7fb3d5", "#82e0aa", "#f7dc6f", "#bb8fce", "#f0b27a", "#76d7c4", "#d7bde2", "#aab7b8"]
COMM_COLOUR, INF = "#5d6d7e", float("inf")

CSS = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } .sub { color: #666; margin: 0 0 8px; }
.legend { margin: 8px 0; line-height: 1.7; } .legend li { list-style: none; }
.legend ul { padding: 0; margin: 0; } .swatch { display: inline-block; width: 14px; height: 12px;
  margin: 0 4px 0 10px; vertical-align: middle; border: 1px solid #888; }
svg text { font: 11px monospace; fill: #111; } .rank { font-weight: bold; font-size: 12px; }
.lane-bg { fill: #fafafa; stroke: #ddd; } .grid { stroke: #e4e4e4; } .axis { stroke: #444; }
.box { stroke: #fff; stroke-width: 1; } .op text { fill: #fff; } .exposed { fill: #e74c3c; }
.bubble { fill: url(#hatch); stroke: #999; stroke-dasharray: 2 2; }
table.costs { border-collapse: collapse; margin-top: 12px; } .costs td, .costs th { border: 1px solid #ccc;
  padding: 3px 10px; text-align: right; } .costs th { background: #eee; } .costs td:first-child { text-align: left; }
"""
HATCH = ('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
         'patternTransform="rotate(45)"><rect width="6" height="6" fill="#e6e6e6"/>'
         '<line x1="0" y1="0" x2="0" y2="6" stroke="#9a9a9a" stroke-width="2"/></pattern></defs>')


def _e(value) -> str:
    return escape(str(value), quote=True)


def fmt_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def fmt_ms(us: float) -> str:
    return f"{us / 1000:.2f} ms"


def _tracks(spans: list) -> list[int]:
    """A track per (start, end) such that spans on one track never overlap (greedy interval partitioning)."""
    ends: list[float] = []
    tracks = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        start, end = spans[i]
        free = next((t for t, last in enumerate(ends) if last <= start), len(ends))
        ends[free:free + 1] = [end]
        tracks[i] = free
    return tracks


def _union(spans) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _minus(span, covered) -> list[tuple[float, float]]:
    """The pieces of ``span`` outside the merged, sorted intervals ``covered``."""
    pieces, (a, b) = [], span
    for c, d in covered:
        if c > a:
            pieces.append((a, min(b, c)))
        a = max(a, d)
        if a >= b:
            return [p for p in pieces if p[1] > p[0]]
    return [p for p in pieces + [(a, b)] if p[1] > p[0]]


def analyse(chrome: dict, exposed_after: str | None = "backward") -> dict:
    """Per rank: phases and ops with their tracks, bubbles, exposed pieces and totals (times in µs).

    An op's exposed part is what runs after the rank's last phase named ``exposed_after*`` ends (nothing, on a
    rank without one), as ``render_lanes`` marks it; with ``exposed_after=None``, what no phase covers.
    """
    spans = [e for e in chrome.get("traceEvents", []) if e.get("ph") == "X"]
    ranks = {}
    for rank in sorted({e["pid"] for e in spans}):
        phases = sorted((e for e in spans if e["pid"] == rank and e.get("tid", 0) == 0), key=lambda e: e["ts"])
        ops = sorted((e for e in spans if e["pid"] == rank and e.get("tid", 0) != 0), key=lambda e: e["ts"])
        busy = _union((p["ts"], p["ts"] + p["dur"]) for p in phases)
        if exposed_after is None:
            covered = busy
        else:
            ends = [p["ts"] + p["dur"] for p in phases if p["name"].startswith(exposed_after)]
            covered = [(-INF, max(ends))] if ends else [(-INF, INF)]
        exposed = [_minus((o["ts"], o["ts"] + o["dur"]), covered) for o in ops]
        bubbles = [(a[1], b[0]) for a, b in zip(busy, busy[1:])]
        ranks[rank] = {
            "phases": phases, "phase_tracks": _tracks([(p["ts"], p["ts"] + p["dur"]) for p in phases]),
            "ops": ops, "op_tracks": _tracks([(o["ts"], o["ts"] + o["dur"]) for o in ops]),
            "exposed": exposed, "bubbles": bubbles,
            "span": busy[-1][1] - busy[0][0] if busy else 0.0, "idle": sum(b - a for a, b in bubbles),
            "exposed_total": sum(b - a for a, b in _union(p for pieces in exposed for p in pieces)),
        }
    span = sum(r["span"] for r in ranks.values())
    return {"ranks": ranks, "t_end": max((e["ts"] + e["dur"] for e in spans), default=0.0) or 1.0,
            "bubble_fraction": sum(r["idle"] for r in ranks.values()) / span if span else 0.0}


def _ticks(t_end: float) -> list[float]:
    """Tick positions in µs at a 1-2-5 step, about eight over [0, t_end]."""
    raw = t_end / 8
    step = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1.0
    step = next(s * step for s in (1, 2, 5, 10) if s * step >= raw)
    return [i * step for i in range(int(t_end // step) + 1)]


def op_label(e: dict) -> str:
    args = e.get("args", {})
    peer = args.get("peer")
    arrow = "" if peer is None else (f" → r{peer}" if e["name"] == "send" else f" ← r{peer}")
    size = args.get("out_bytes") if e["name"] == "recv" else args.get("bytes")
    return f"{e['name']}{'' if size is None or (e['name'] == 'recv' and not size) else ' ' + fmt_bytes(size)}{arrow}"


def _box(cls: str, attrs: str, x: float, y: float, w: float, label: str, tip: str, fill: str, marks=()) -> str:
    """A labelled box: a nested <svg> clips its label to the box; ``marks`` are (x0, x1) exposed pieces in it."""
    inner = "".join(f'<rect class="exposed" x="{a:.1f}" y="0" width="{max(b - a, 1):.1f}" height="{ROW}"/>'
                    for a, b in marks)
    return (f'<svg class="{cls}" {attrs} x="{x:.1f}" y="{y}" width="{max(w, 1):.1f}" height="{ROW}">'
            f'<title>{_e(tip)}</title><rect class="box" width="100%" height="100%" style="fill:{fill}"/>{inner}'
            f'<text x="3" y="14">{_e(label)}</text></svg>')


def _lane(rank: int, view: dict, y0: float, x_of, colours: dict) -> tuple[str, float]:
    n_compute = max(view["phase_tracks"], default=0) + 1
    n_comm = max(view["op_tracks"], default=0) + 1
    height = (n_compute + n_comm) * (ROW + GAP) + GAP
    row_y = lambda row: GAP + row * (ROW + GAP)  # noqa: E731
    out = [f'<g class="lane" data-rank="{rank}" transform="translate(0 {y0:.0f})">',
           f'<rect class="lane-bg" x="0" y="0" width="{LEFT + PLOT + 10}" height="{height}"/>',
           f'<text class="rank" x="6" y="{row_y(0) + 14}">rank {rank}</text>',
           f'<text x="60" y="{row_y(0) + 14}">compute</text>']
    out += [f'<text x="60" y="{row_y(n_compute + t) + 14}">comm{"" if t == 0 else f" {t + 1}"}</text>'
            for t in range(n_comm)]
    for a, b in view["bubbles"]:
        out.append(f'<rect class="bubble" x="{x_of(a):.1f}" y="{GAP}" width="{max(x_of(b) - x_of(a), 1):.1f}" '
                   f'height="{n_compute * (ROW + GAP) - GAP}"><title>rank {rank} idle {_e(fmt_ms(b - a))} '
                   f'(bubble)</title></rect>')
    for p, track in zip(view["phases"], view["phase_tracks"]):
        x = x_of(p["ts"])
        tip = f"rank {rank} phase {p['name']}: {fmt_ms(p['ts'])} to {fmt_ms(p['ts'] + p['dur'])} ({fmt_ms(p['dur'])})"
        out.append(_box("phase", f'data-name="{_e(p["name"])}"', x, row_y(track), x_of(p["ts"] + p["dur"]) - x,
                        p["name"], tip, colours[p["name"].split(" ")[0]]))
    for o, track, pieces in zip(view["ops"], view["op_tracks"], view["exposed"]):
        x, args = x_of(o["ts"]), o.get("args", {})
        tip = (f"rank {rank} {op_label(o)}: issued {fmt_ms(o['ts'])}, done {fmt_ms(o['ts'] + o['dur'])}"
               + "".join(f", {k} {args[k]}" for k in ("phase", "step", "site", "blocking") if args.get(k) is not None)
               + (f"; exposed {fmt_ms(sum(b - a for a, b in pieces))}" if pieces else ""))
        marks = [(x_of(a) - x, x_of(b) - x) for a, b in pieces]
        out.append(_box("op", f'data-kind="{_e(o["name"])}"', x, row_y(n_compute + track),
                        x_of(o["ts"] + o["dur"]) - x, op_label(o), tip, COMM_COLOUR, marks))
    return "".join(out) + "</g>", height


def _svg(view: dict, colours: dict) -> str:
    t_end = view["t_end"]
    x_of = lambda t: LEFT + PLOT * t / t_end  # noqa: E731
    lanes, y = [], 30.0
    for rank, rv in view["ranks"].items():
        lane, height = _lane(rank, rv, y, x_of, colours)
        lanes.append(lane)
        y += height + 8
    ticks = _ticks(t_end)
    grid = "".join(f'<line class="grid" x1="{x_of(t):.1f}" y1="24" x2="{x_of(t):.1f}" y2="{y:.0f}"/>'
                   f'<line class="axis" x1="{x_of(t):.1f}" y1="20" x2="{x_of(t):.1f}" y2="26"/>'
                   f'<text x="{x_of(t) - 10:.1f}" y="14">{round(t / 1000, 6):g} ms</text>' for t in ticks)
    axis = f'<line class="axis" x1="{LEFT}" y1="24" x2="{LEFT + PLOT}" y2="24"/>'
    width = LEFT + PLOT + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{y:.0f}" '
            f'viewBox="0 0 {width} {y:.0f}">{HATCH}{grid}{axis}{"".join(lanes)}</svg>')


def _legend(view: dict, colours: dict, exposed_after: str | None) -> str:
    swatch = '<span class="swatch" style="background:{}"></span>'
    phases = "".join(swatch.format(c) + _e(name) for name, c in colours.items()) or " none marked"
    rule = (f"after the rank's last <code>{_e(exposed_after)}</code> phase ends (as <code>--show</code> marks it)"
            if exposed_after is not None else "not covered by any phase of its rank")
    exposed = ", ".join(f"rank {r} {fmt_ms(rv['exposed_total'])}" for r, rv in view["ranks"].items())
    ranks = view["ranks"].values()
    idle, span = sum(r["idle"] for r in ranks), sum(r["span"] for r in ranks)
    return ('<div class="legend"><ul>'
            f'<li><b>compute phases:</b>{phases}</li>'
            f'<li><b>communication:</b>{swatch.format(COMM_COLOUR)}an op, from issue to the end of its wait, '
            'labelled with its kind and bytes sent; ops in flight at once get a track each</li>'
            f'<li class="legend-exposed"><b>exposed communication</b>{swatch.format("#e74c3c")}{rule}: {exposed}</li>'
            f'<li class="legend-bubble"><b>bubble</b><span class="swatch" style="background:#ccc"></span>idle '
            f'between a rank\'s first phase start and last phase end: <b>bubble fraction '
            f'{100 * view["bubble_fraction"]:.1f}%</b> ({fmt_ms(idle)} idle of {fmt_ms(span)}, all ranks)</li>'
            '</ul></div>')


def _costs(costs: list) -> str:
    cell = lambda v: f"{v:.3g}" if isinstance(v, float) else _e(v)  # noqa: E731
    keys = ("figure", "model", "yours", "ratio")
    rows = "".join("<tr>" + "".join(f"<td>{cell(c.get(k, ''))}</td>" for k in keys) + "</tr>" for c in costs)
    return ('<table class="costs"><tr><th>figure</th><th>model</th><th>yours</th><th>ratio</th></tr>'
            f"{rows}</table>")


def render_html(chrome: dict, title: str, costs: list | None = None, exposed_after: str | None = "backward") -> str:
    """The whole page for one call's Chrome trace; ``costs``: rows of {figure, model, yours, ratio}."""
    view = analyse(chrome, exposed_after)
    names = sorted({p["name"].split(" ")[0] for rv in view["ranks"].values() for p in rv["phases"]})
    colours = {name: PHASE_COLOURS[i % len(PHASE_COLOURS)] for i, name in enumerate(names)}
    other = chrome.get("otherData", {})
    sub = ", ".join(f"{k} {other[k]}" for k in ("test", "outcome", "case") if other.get(k))
    body = (_legend(view, colours, exposed_after) + _svg(view, colours) if view["ranks"]
            else "<p>(no phases or communication recorded)</p>")
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">'
            f'<title>{_e(title)}</title><style>{CSS}</style></head><body><h1>{_e(title)}</h1>'
            + (f'<p class="sub">{_e(sub)}</p>' if sub else "")
            + body + (_costs(costs) if costs else "") + "</body></html>\n")
