"""A self-contained interactive flame graph as one SVG file.

Frames are boxes whose width is their value's share of the total, root at
the bottom. Everything that makes it interactive is in the file (a small
script, no network): click a frame to zoom into it (its callers stay, faded,
below it; click one of them or `Reset zoom` to go back), `Search` (or Ctrl-F,
`/`) takes a regular expression, highlights the matching frames and shows
the share of the total under them, and every frame has a tooltip with its
name, value and share. Escape resets zoom and search.

Each frame is `<g data-s=START data-v=VALUE>` around its `<title>`, `<rect>`
and, when it is wide enough, `<text>`: START and VALUE are in value units
(samples, ns or waits), exact integers the script zooms with. The root
`<svg>` carries the geometry (`data-x0`, `data-width`, `data-fh`,
`data-row0`: the y of the root row), `data-total`, `data-unit`,
`data-pruned` and `data-kind`.

Frames narrower than `min_width` pixels are not drawn (nor anything they
called): a profile of a million samples over a hundred thousand stacks
otherwise makes a file that browsers take seconds to open, for boxes too
thin to see. How many were pruned, and their share, is written under the
graph.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape

from kvprof.export.frames import APP, HOTSPOT, KERNEL, LIB, SYNTHETIC, Classifier
from kvprof.export.stacks import TITLES
from kvprof.export.tree import Box, Layout
from kvprof.model.profile import Profile

WIDTH = 1200  # px, the whole image
PAD = 10  # px left and right of the frames
FRAME_H = 16  # px per row
TOP = 64  # px above the frames: title, subtitle, buttons
BOTTOM = 52  # px below: details line, legend, pruned note
CHAR_W = 7.2  # px per character of the 12 px monospace font
MIN_WIDTH = 0.1  # px: narrower frames are pruned (flamegraph.pl's default too)

# frame type -> (hue range start, hue range size, saturation %, lightness %)
_HUES = {
    APP: (14, 22, 85, 60),  # orange: the target's own code
    LIB: (44, 14, 75, 58),  # yellow: libc and other libraries
    KERNEL: (160, 25, 45, 55),  # sea green: the kernel
    HOTSPOT: (262, 12, 62, 64),  # violet: the hotspot catalog's functions and locks
    SYNTHETIC: (0, 0, 0, 78),  # grey: all, thread/socket prefixes, [futex] leaves
}

LEGEND_LABELS = {
    APP: "{exe} code",
    LIB: "libraries",
    KERNEL: "kernel",
    HOTSPOT: "known hotspot (kvprof catalog)",
}


def frame_colour(kind: str, name: str) -> str:
    """The fill of a frame of type `kind`: the type's hue, varied a little by name
    so that neighbours are told apart, the same name always the same colour."""
    h0, span, sat, light = _HUES[kind]
    v = zlib.crc32(name.encode("utf-8", "replace"))
    hue = h0 + span * ((v & 0xFF) / 255)
    lightness = light + 8 * (((v >> 8) & 0xFF) / 255 - 0.5) if span else light
    return _hsl(hue, sat, lightness)


def _hsl(h: float, s: float, lum: float) -> str:
    """#rrggbb of an HSL colour (hue in degrees, saturation and lightness in %)."""
    s, lum = s / 100, lum / 100
    a = s * min(lum, 1 - lum)

    def f(n: int) -> int:
        k = (n + h / 30) % 12
        return round(255 * (lum - a * max(-1.0, min(k - 3, 9 - k, 1.0))))

    return f"#{f(0):02x}{f(8):02x}{f(4):02x}"


LEGEND_COLOURS = {kind: _hsl(h0 + span / 2, sat, light) for kind, (h0, span, sat, light) in _HUES.items()}


def format_value(value: float, unit: str) -> str:
    """`1,234 samples`, `12.3 ms`, `56 waits`."""
    if unit == "ns":
        if value >= 1e9:
            return f"{value / 1e9:,.2f} s"
        if value >= 1e6:
            return f"{value / 1e6:,.1f} ms"
        if value >= 1e3:
            return f"{value / 1e3:,.1f} µs"
        return f"{value:,.0f} ns"
    return f"{value:,.0f} {unit[:-1] if value == 1 else unit}"


def min_value(total: int, width: int, min_width: float) -> float:
    """The value of a frame `min_width` px wide in a graph `width` px wide."""
    return min_width / (width - 2 * PAD) * total


def label_of(name: str, width: float) -> str:
    """As much of `name` as fits in `width` px, `..` marking a cut; "" under 3 characters."""
    n = int((width - 6) // CHAR_W)
    if n < 3:
        return ""
    return name if len(name) <= n else name[: n - 2] + ".."


# (fill, tooltip's second line, extra class or "") for a box
FrameStyle = Callable[[Box], tuple[str, str, str]]


@dataclass
class Chart:
    """What is drawn around the frames."""

    title: str
    subtitle: str
    kind: str  # cpu | offcpu | locks (diffs too)
    unit: str  # samples | ns | waits
    legend: list[tuple[str, str]] = field(default_factory=list)  # (colour, label)
    width: int = WIDTH
    min_width: float = MIN_WIDTH
    empty_text: str = "no samples"


def render(layout: Layout, chart: Chart, style: FrameStyle) -> str:
    """The SVG document of `layout`."""
    w = chart.width - 2 * PAD
    rows = max(layout.depth, 1)
    row0 = TOP + (rows - 1) * FRAME_H  # y of the root row
    height = TOP + rows * FRAME_H + BOTTOM + (80 if not layout.boxes else 0)
    total = layout.total
    out: list[str] = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{chart.width}" height="{height}" '
        f'viewBox="0 0 {chart.width} {height}" data-x0="{PAD}" data-width="{w}" data-fh="{FRAME_H}" '
        f'data-row0="{row0}" data-total="{total}" data-unit="{chart.unit}" data-pruned="{layout.pruned}" '
        f'data-kind="{escape(chart.kind)}" onload="init()">\n',
        f"<style>{CSS}</style>\n",
        f"<script><![CDATA[{SCRIPT}]]></script>\n",
        f'<rect width="{chart.width}" height="{height}" fill="#fbfbf8"/>\n',
        f'<text id="title" x="{chart.width / 2}" y="24">{escape(chart.title)}</text>\n',
        f'<text id="subtitle" x="{chart.width / 2}" y="44">{escape(chart.subtitle)}</text>\n',
        f'<text id="reset" class="button hidden" x="{PAD}" y="24">Reset zoom</text>\n',
        f'<text id="search" class="button" x="{chart.width - PAD}" y="24">Search</text>\n',
    ]
    below = TOP + rows * FRAME_H
    if not layout.boxes:
        out.append(
            f'<text id="empty" x="{chart.width / 2}" y="{TOP + 50}">{escape(chart.empty_text)}</text>\n'
        )
        below += 80
    out.append('<g id="frames">\n')
    scale = w / total if total else 0.0
    box_h = FRAME_H - 1  # a pixel of background between rows
    for box in layout.boxes:
        x = PAD + box.start * scale
        width = box.value * scale
        y = row0 - box.depth * FRAME_H
        fill, tip, cls = style(box)
        name = escape(box.name, quote=False)
        label = label_of(box.name, width)
        text = (
            f'<text x="{x + 3:.2f}" y="{y + FRAME_H - 4.5}">{escape(label, quote=False)}</text>'
            if label
            else ""
        )
        cls_attr = f' class="{cls}"' if cls else ""
        tip = escape(tip, quote=False)
        out.append(
            f'<g{cls_attr} data-s="{box.start}" data-v="{box.value}"><title>{name}\n{tip}</title>'
            f'<rect x="{x:.2f}" y="{y}" width="{width:.2f}" height="{box_h}" fill="{fill}"/>{text}</g>\n'
        )
    out.append("</g>\n")
    out.append(f'<text id="details" x="{PAD}" y="{below + 18}"> </text>\n')
    out.append(f'<text id="matched" x="{chart.width - PAD}" y="{below + 18}"> </text>\n')
    x = PAD
    for colour, text in chart.legend:
        out.append(
            f'<rect class="swatch" x="{x}" y="{below + 30}" width="12" height="12" fill="{colour}"/>'
            f'<text class="legend" x="{x + 16}" y="{below + 40}">{escape(text)}</text>\n'
        )
        x += 16 + int(len(text) * CHAR_W) + 22
    if layout.pruned:
        share = layout.pruned_value / total if total else 0.0
        note = (
            f"{layout.pruned:,} frames narrower than {chart.min_width:g} px not drawn "
            f"({share:.2%} of the total)"
        )
    else:
        note = "no frames pruned"
    out.append(f'<text id="pruned" x="{chart.width - PAD}" y="{below + 40}">{escape(note)}</text>\n')
    out.append("</svg>\n")
    return "".join(out)


# ---- a profile's flame graph ----------------------------------------------------


def describe_window(profile: Profile) -> str:
    """`4.0 s`, and when it was recorded."""
    dur = profile.window.duration_s
    parts = [f"over {dur:.1f} s" if dur else "window unknown"]
    if profile.window.start:
        parts.append("recorded " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(profile.window.start)))
    return ", ".join(parts)


def target_name(profile: Profile) -> str:
    t = profile.target
    return f"{t.comm or 'process'} PID {t.pid}"


def subtitle(profile: Profile, kind: str, unit: str, total: int, prefix: str | None) -> str:
    dur = profile.window.duration_s
    if unit == "samples":
        what = f"{total:,} samples at {profile.hz} Hz" if profile.hz else f"{total:,} samples"
    elif unit == "waits":
        what = f"{total:,} lock waits" + (f" ({total / dur:,.0f}/s)" if dur else "")
    else:
        label = "off-CPU" if kind == "offcpu" else "waiting for locks"
        what = f"{format_value(total, 'ns')} {label}" + (f" ({total / dur / 1e6:,.1f} ms/s)" if dur else "")
    parts = [kind, what, describe_window(profile)]
    threads = sum(1 for t in profile.threads.values() if t.name)
    if threads:
        parts.append(f"{threads} threads")
    if prefix:
        parts.append(f"by {prefix}")
    return " · ".join(parts)


def profile_chart(
    profile: Profile, kind: str, unit: str, total: int, prefix: str | None, width: int, min_width: float
) -> Chart:
    exe = profile.target.comm or "target"
    legend = [(LEGEND_COLOURS[k], LEGEND_LABELS[k].format(exe=exe)) for k in (APP, LIB, KERNEL, HOTSPOT)]
    if kind == "locks":
        empty = "no samples: no lock waits in this profile"
    elif kind == "offcpu":
        empty = "no samples: no off-CPU stacks in this profile"
    else:
        empty = "no samples: no on-CPU stacks in this profile"
    return Chart(
        title=f"{TITLES[kind][0].upper()}{TITLES[kind][1:]} flame graph: {target_name(profile)}",
        subtitle=subtitle(profile, kind, unit, total, prefix),
        kind=kind,
        unit=unit,
        legend=legend,
        width=width,
        min_width=min_width,
        empty_text=empty,
    )


def frame_style(profile: Profile, unit: str, total: int, prefix: str | None) -> FrameStyle:
    """Colour by frame type; the tooltip gives the value and its share."""
    classify = Classifier(profile, synthetic_depth=1 if prefix else 0)
    colours: dict[tuple[str, int], str] = {}

    def style(box: Box) -> tuple[str, str, str]:
        key = (box.name, min(box.depth, 2))  # depth matters only for the made-up root rows
        colour = colours.get(key)
        if colour is None:
            colour = colours[key] = frame_colour(classify(box.name, box.depth), box.name)
        share = box.value / total if total else 0.0
        return colour, f"{format_value(box.value, unit)}, {share:.2%}", ""

    return style


# ---- what makes it interactive ---------------------------------------------------

CSS = """
text { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; fill: #000; }
#title { font-size: 17px; font-weight: bold; text-anchor: middle; }
#subtitle { fill: #555; text-anchor: middle; }
#empty { font-size: 20px; fill: #777; text-anchor: middle; }
#search, #matched, #pruned { text-anchor: end; }
#pruned, .legend { fill: #555; }
.button { fill: #1a5fb4; cursor: pointer; }
.button:hover { text-decoration: underline; }
.hidden { display: none; }
#frames g { cursor: pointer; }
#frames text { pointer-events: none; }
#frames g:hover rect { stroke: #000; stroke-width: 0.8; }
#frames g.anc rect { opacity: 0.45; }
#frames g.match rect { fill: #e600e6; }
"""

# Kept small on purpose: frames are found by geometry (a descendant lies inside
# its ancestor's [start, start + value) one row or more above it), so the
# script needs no tree, only the data-s / data-v / y of each frame.
SCRIPT = """
"use strict";
var NS = "http://www.w3.org/2000/svg", CHAR_W = 7.2;
var W, X0, FH, ROW0, TOTAL, frames = [], zoomed = null, term = null;

function el(id) { return document.getElementById(id); }

function init() {
  var d = document.documentElement.dataset;
  W = +d.width; X0 = +d.x0; FH = +d.fh; ROW0 = +d.row0; TOTAL = +d.total;
  var gs = el("frames").children;
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], r = g.querySelector("rect"), tip = g.querySelector("title").textContent;
    var y = +r.getAttribute("y");
    g.frame = { g: g, r: r, text: g.querySelector("text"), s: +g.dataset.s, v: +g.dataset.v,
                d: Math.round((ROW0 - y) / FH), y: y, name: tip.split("\\n")[0],
                tip: tip.replace("\\n", " \\u2014 ") };
    frames.push(g.frame);
  }
  var box = el("frames");
  box.addEventListener("click", function (e) { var f = frameOf(e.target); if (f) zoom(f); });
  box.addEventListener("mouseover", function (e) { var f = frameOf(e.target); if (f) details(f.tip); });
  box.addEventListener("mouseout", function () { details(" "); });
  el("reset").addEventListener("click", reset);
  el("search").addEventListener("click", function () { if (term === null) search(); else clearSearch(); });
  window.addEventListener("keydown", function (e) {
    if ((e.ctrlKey && e.key === "f") || e.key === "/") { e.preventDefault(); search(); }
    else if (e.key === "Escape") { reset(); clearSearch(); }
  });
}

function frameOf(node) {
  while (node && node.frame === undefined) node = node.parentNode;
  return node ? node.frame : null;
}

function details(text) { el("details").textContent = text; }

function label(f, x, w) {
  var n = Math.floor((w - 6) / CHAR_W);
  var s = n < 3 ? "" : f.name.length <= n ? f.name : f.name.slice(0, n - 2) + "..";
  if (!f.text) {
    if (!s) return;
    f.text = document.createElementNS(NS, "text");
    f.text.setAttribute("y", f.y + FH - 4.5);
    f.g.appendChild(f.text);
  }
  f.text.textContent = s;
  f.text.setAttribute("x", (x + 3).toFixed(2));
}

function place(f, x, w, faded) {
  var px = X0 + x * W, pw = w * W;
  f.g.classList.remove("hidden");
  f.g.classList.toggle("anc", faded);
  f.r.setAttribute("x", px.toFixed(2));
  f.r.setAttribute("width", pw.toFixed(2));
  label(f, px, pw);
}

// Zoom: `f` fills the width, what it called is scaled with it, its callers
// stay below it (faded, clickable to zoom out to them), the rest is hidden.
function zoom(f) {
  if (f.d === 0) { reset(); return; }
  zoomed = f;
  for (var i = 0; i < frames.length; i++) {
    var g = frames[i];
    if (g.d >= f.d && g.s >= f.s && g.s + g.v <= f.s + f.v) place(g, (g.s - f.s) / f.v, g.v / f.v, false);
    else if (g.d < f.d && g.s <= f.s && g.s + g.v >= f.s + f.v) place(g, 0, 1, true);
    else g.g.classList.add("hidden");
  }
  el("reset").classList.remove("hidden");
}

function reset() {
  if (zoomed === null) return;
  zoomed = null;
  for (var i = 0; i < frames.length; i++) place(frames[i], frames[i].s / TOTAL, frames[i].v / TOTAL, false);
  el("reset").classList.add("hidden");
}

// Search: frames whose name matches `re` are highlighted; the share is of the
// total under any matching frame, a match inside a match counted once.
function search(re) {
  if (re === undefined) {
    re = prompt("Search frames (regular expression):", term || "");
    if (re === null) return;
  }
  if (re === "") { clearSearch(); return; }
  var rx;
  try { rx = new RegExp(re); } catch (e) { alert("not a regular expression: " + re); return; }
  var hits = [];
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i], hit = rx.test(f.name);
    f.g.classList.toggle("match", hit);
    if (hit) hits.push([f.s, f.s + f.v]);
  }
  hits.sort(function (a, b) { return a[0] - b[0]; });
  var covered = 0, end = -1;
  for (var j = 0; j < hits.length; j++) {
    var a = Math.max(hits[j][0], end), b = hits[j][1];
    if (b > a) { covered += b - a; end = b; }
  }
  term = re;
  var share = TOTAL ? (100 * covered / TOTAL).toFixed(2) : "0.00";
  el("matched").textContent = "Matched: " + share + "% (" + hits.length + " frames, /" + re + "/)";
  el("search").textContent = "Reset search";
}

function clearSearch() {
  term = null;
  for (var i = 0; i < frames.length; i++) frames[i].g.classList.remove("match");
  el("matched").textContent = " ";
  el("search").textContent = "Search";
}
"""
