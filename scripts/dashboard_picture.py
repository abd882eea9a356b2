#!/usr/bin/env python3
"""Draws the Grafana dashboard's panels as a PNG, from a Prometheus's answers to its queries.

Each panel's queries run over the last few minutes with the dashboard's variables filled in
as the test suite fills them ($__rate_interval as 30s, $controller as every controller),
and are drawn at the panel's place in Grafana's 24-column grid. A panel whose queries
return nothing reads "No data" rather than disappearing, so the picture shows what the
dashboard would.

    python3 scripts/dashboard_picture.py --prometheus http://127.0.0.1:9090 --out dashboard.png
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyBboxPatch
    from matplotlib.ticker import FuncFormatter, MaxNLocator
except ImportError:
    sys.exit("dashboard_picture.py draws with matplotlib, which is missing: pip install matplotlib")

DEFAULT_DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "kube-informer.json"

# The values the test suite gives Grafana's variables.
VARIABLES = {"__rate_interval": "30s", "controller": ".*"}

# Grafana's dark theme and its classic palette.
BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3235"
GRID = "#2a2d33"
TEXT = "#ccccdc"
MUTED = "#8e8e9a"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0"]

# Grafana's grid: 24 columns across, rows of 30 px with 8 px between panels.
COLUMNS = 24
ROW_PX = 30
GAP_PX = 8
HEADER_PX = 60
LEGEND_ENTRIES = 4
LEGEND_CHARS = 34


def fill(expr):
    """The query with the dashboard's variables replaced, in both of Grafana's spellings."""
    for name, value in VARIABLES.items():
        expr = expr.replace("${" + name + "}", value)
        expr = re.sub(r"\$" + re.escape(name) + r"\b", lambda _: value, expr)
    return expr


def query_range(prometheus, expr, start, end, step):
    """The matrix Prometheus answers for `expr`, or raises with its error."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    url = prometheus.rstrip("/") + "/api/v1/query_range?" + params
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:
        # A bad query comes back as 400 with Prometheus's reason in the body.
        try:
            answer = json.load(error)
        except ValueError:
            raise RuntimeError(f"HTTP {error.code}") from error
    if answer.get("status") != "success":
        raise RuntimeError(answer.get("error", "query failed"))
    return answer["data"]["result"]


def legend(target, series):
    """Grafana's legend for a series: the target's format with {{label}} filled in."""
    labels = series.get("metric", {})
    form = target.get("legendFormat")
    if form and form != "__auto":
        text = re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", lambda m: labels.get(m.group(1), ""), form)
    else:
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        text = labels.get("__name__", "") + "{" + ", ".join(f'{k}="{v}"' for k, v in shown.items()) + "}"
    text = " ".join(text.split()) or target.get("refId", "series")
    return text if len(text) <= LEGEND_CHARS else text[: LEGEND_CHARS - 1] + "…"


def number(value):
    """A short number: three significant digits, no exponent."""
    if value == 0:
        return "0"
    text = f"{value:.3g}"
    if "e" in text:
        text = f"{value:.0f}" if abs(value) >= 1 else f"{value:.6f}".rstrip("0")
    return text


def scaled(value, steps, base):
    """`value` in the largest of `steps` (suffixes by power of `base`) that keeps it ≥ 1."""
    power = 0
    while power + 1 < len(steps) and abs(value) >= base ** (power + 1):
        power += 1
    return number(value / base**power) + steps[power]


def seconds(value):
    magnitude = abs(value)
    if value == 0:
        return "0 s"
    if magnitude < 1e-3:
        return number(value * 1e6) + " µs"
    if magnitude < 1:
        return number(value * 1e3) + " ms"
    if magnitude < 60:
        return number(value) + " s"
    if magnitude < 3600:
        return number(value / 60) + " min"
    return number(value / 3600) + " h"


def formatter(unit):
    """A tick formatter for Grafana's unit names (the common ones; others are shown as given)."""
    si = ["", " K", " Mil", " Bil", " Tri"]
    units = {
        "short": lambda v: scaled(v, si, 1000),
        "none": number,
        "s": seconds,
        "ms": lambda v: seconds(v / 1e3),
        "ops": lambda v: scaled(v, si, 1000).rstrip() + " ops/s",
        "reqps": lambda v: scaled(v, si, 1000).rstrip() + " req/s",
        "rps": lambda v: scaled(v, si, 1000).rstrip() + " rd/s",
        "wps": lambda v: scaled(v, si, 1000).rstrip() + " wr/s",
        "bytes": lambda v: scaled(v, [" B", " KiB", " MiB", " GiB", " TiB"], 1024),
        "decbytes": lambda v: scaled(v, [" B", " kB", " MB", " GB", " TB"], 1000),
        "percent": lambda v: number(v) + "%",
        "percentunit": lambda v: number(v * 100) + "%",
    }
    if unit in units:
        return units[unit]
    if unit:
        return lambda v: number(v) + " " + unit
    return lambda v: scaled(v, si, 1000)


def panel_rect(grid, width_px, height_px):
    """The panel's box (left, bottom, width, height) in figure fractions."""
    column = (width_px - GAP_PX) / COLUMNS
    left = GAP_PX + grid["x"] * column
    width = grid["w"] * column - GAP_PX
    top = HEADER_PX + grid["y"] * (ROW_PX + GAP_PX)
    height = grid["h"] * (ROW_PX + GAP_PX) - GAP_PX
    return (
        left / width_px,
        1 - (top + height) / height_px,
        width / width_px,
        height / height_px,
    )


def draw_panel(fig, panel, rect, width_px, height_px, series, errors, start, end):
    left, bottom, width, height = rect
    fig.patches.append(
        FancyBboxPatch(
            (left, bottom),
            width,
            height,
            boxstyle="round,pad=0,rounding_size=0.002",
            transform=fig.transFigure,
            facecolor=PANEL,
            edgecolor=BORDER,
            linewidth=1,
            zorder=-1,
        )
    )
    px_w, px_h = 1 / width_px, 1 / height_px
    fig.text(
        left + 10 * px_w,
        bottom + height - 10 * px_h,
        panel.get("title", ""),
        color=TEXT,
        fontsize=10.5,
        fontweight="bold",
        va="top",
        ha="left",
    )
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    # Room for the title above, the tick labels left and below, and the legend at the bottom.
    legend_rows = min(len(series), LEGEND_ENTRIES + (1 if len(series) > LEGEND_ENTRIES else 0))
    legend_rows = math.ceil(legend_rows / 2)
    axes = fig.add_axes(
        (
            left + 72 * px_w,
            bottom + (30 + 17 * max(legend_rows, 1)) * px_h,
            width - 86 * px_w,
            height - (40 + 30 + 17 * max(legend_rows, 1)) * px_h,
        )
    )
    axes.set_facecolor(PANEL)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.tick_params(colors=MUTED, labelsize=8, length=0, pad=4)
    axes.grid(True, color=GRID, linewidth=0.8)
    axes.set_axisbelow(True)

    def message(text, color=MUTED, size=13):
        axes.set_xticks([])
        axes.set_yticks([])
        axes.text(0.5, 0.5, text, color=color, fontsize=size, ha="center", va="center", transform=axes.transAxes)

    if errors:
        message("Query error:\n" + "\n".join(e[:70] for e in errors), color="#f2495c", size=9)
        return
    if not series:
        message("No data")
        return

    handles = []
    finite = []
    for index, (label, points) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        times = [datetime.fromtimestamp(t) for t, _ in points]
        values = [v for _, v in points]
        finite += [v for v in values if math.isfinite(v)]
        # Earlier series are drawn wider beneath later ones, so a series that another
        # follows exactly (errors and successes at one rate) still shows at its edges.
        line_width = 1.4 + 0.8 * min(len(series) - 1 - index, 3)
        (line,) = axes.plot(times, values, color=color, linewidth=line_width, label=label, clip_on=False)
        axes.fill_between(times, values, color=color, alpha=0.07, linewidth=0)
        handles.append(line)
    if finite:
        axes.set_xlim(datetime.fromtimestamp(start), datetime.fromtimestamp(end))
        # Like Grafana, a flat zero gets an axis up to one rather than a sliver around it.
        low, high = min(finite), max(finite)
        if low >= 0:
            axes.set_ylim(bottom=0, top=high * 1.1 if high > 0 else 1)
        axes.yaxis.set_major_locator(MaxNLocator(nbins=4, min_n_ticks=2))
        axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: formatter(unit)(v)))
        axes.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=5))
        axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    else:
        # Series came back, but with nothing a graph can draw (a quantile of no observations,
        # or of a histogram without its +Inf bucket, is NaN): say so rather than show axes.
        message("No data\n(every value is NaN)")

    shown = handles[:LEGEND_ENTRIES]
    if len(handles) > LEGEND_ENTRIES:
        shown = shown + [Line2D([], [], color="none", label=f"+{len(handles) - LEGEND_ENTRIES} more")]
    fig.legend(
        handles=shown,
        loc="lower left",
        bbox_to_anchor=(left + 8 * px_w, bottom + 4 * px_h),
        bbox_transform=fig.transFigure,
        ncol=2 if len(shown) > 1 else 1,
        frameon=False,
        fontsize=8,
        labelcolor=TEXT,
        handlelength=1.2,
        handletextpad=0.5,
        columnspacing=1.5,
        borderaxespad=0,
        borderpad=0,
        labelspacing=0.35,
    )


def main():
    parser = argparse.ArgumentParser(
        description="Draw the Grafana dashboard's panels as a PNG from a Prometheus's answers to its queries."
    )
    parser.add_argument("--prometheus", required=True, metavar="URL", help="the Prometheus to query, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboard", default=str(DEFAULT_DASHBOARD), metavar="PATH", help="the dashboard's JSON (default: %(default)s)")
    parser.add_argument("--minutes", type=float, default=3, metavar="N", help="how many minutes up to now to draw (default: %(default)s)")
    parser.add_argument("--end", type=float, metavar="UNIXTIME", help="draw up to this time instead of now (seconds since the epoch)")
    parser.add_argument("--out", required=True, metavar="PNG", help="where to write the picture")
    parser.add_argument("--width", type=int, default=1600, metavar="PX", help="the picture's width in pixels (default: %(default)s)")
    args = parser.parse_args()

    dashboard = json.loads(Path(args.dashboard).read_text())
    panels = [p for p in dashboard.get("panels", []) if "gridPos" in p and p.get("type") != "row"]
    if not panels:
        sys.exit(f"{args.dashboard} has no panels")

    end = args.end if args.end is not None else time.time()
    start = end - args.minutes * 60
    # A point every few seconds: fine enough for the 1 s scrapes to show, and a few hundred points.
    step = max(2, round(args.minutes * 60 / 240))

    drawn = []
    failed = 0
    for panel in panels:
        series, errors = [], []
        for target in panel.get("targets", []):
            if target.get("hide") or "expr" not in target:
                continue
            try:
                result = query_range(args.prometheus, fill(target["expr"]), start, end, step)
            except urllib.error.URLError as error:
                sys.exit(f"cannot reach Prometheus at {args.prometheus}: {error.reason}")
            except (RuntimeError, OSError) as error:
                errors.append(str(error))
                print(f"{panel.get('title')}: {error}", file=sys.stderr)
                continue
            for one in result:
                points = [(float(t), float(v)) for t, v in one.get("values", [])]
                if points:
                    series.append((legend(target, one), points))
        series.sort(key=lambda s: s[0])
        failed += bool(errors)
        drawn.append((panel, series, errors))
        if not errors:
            print(f"{panel.get('title')}: {len(series)} series" if series else f"{panel.get('title')}: no data")

    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_px = args.width
    height_px = HEADER_PX + rows * (ROW_PX + GAP_PX) + GAP_PX
    dpi = 100
    fig = plt.figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, facecolor=BACKGROUND)
    fig.text(
        GAP_PX / width_px,
        1 - 16 / height_px,
        dashboard.get("title", ""),
        color=TEXT,
        fontsize=14,
        fontweight="bold",
        va="top",
    )
    fig.text(
        GAP_PX / width_px,
        1 - 38 / height_px,
        "Drawn by scripts/dashboard_picture.py from Prometheus's answers to the dashboard's queries",
        color=MUTED,
        fontsize=8.5,
        va="top",
    )
    span = f"{args.minutes:g} minute" + ("" if args.minutes == 1 else "s")
    fig.text(
        1 - GAP_PX / width_px,
        1 - 18 / height_px,
        f"controller: All    last {span}, to {datetime.fromtimestamp(end):%Y-%m-%d %H:%M:%S}    step {step}s",
        color=MUTED,
        fontsize=9.5,
        va="top",
        ha="right",
    )
    for panel, series, errors in drawn:
        rect = panel_rect(panel["gridPos"], width_px, height_px)
        draw_panel(fig, panel, rect, width_px, height_px, series, errors, start, end)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, facecolor=BACKGROUND)
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    if failed:
        sys.exit(f"{failed} panel(s) had query errors; see above")


if __name__ == "__main__":
    main()
