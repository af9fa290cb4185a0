"""Draw the Grafana dashboard (deploy/grafana/orchestrator.json) from a real Prometheus, as a PNG.

A stand-in for a Grafana screenshot, for the docs (docs/images/dashboard.png): Grafana
is not packaged where this project is built (no Debian package, nothing on PyPI or
npm), Prometheus is.  This script reads the dashboard's JSON, asks Prometheus' HTTP
API (``/api/v1/query_range``) for every target of every panel over a time range, and
draws the panels with matplotlib where the dashboard puts them (``gridPos``: 24
columns, one grid row 30 px as in Grafana; ``row`` panels as section titles), in
colours close to Grafana's dark theme.  It is not Grafana: no tooltips, and each
panel's legend (with its last and largest value) sits inside the plot, not below it.

Each query goes to Prometheus as the dashboard has it, with Grafana's variables
replaced: ``$__rate_interval`` by ``--rate-interval`` (Grafana makes it at least four
scrape intervals; a minute keeps a 10-minute picture readable), ``$__interval`` by the
step, ``$__range`` by the range.  The data source variable (``${datasource}``) does not
matter: there is one Prometheus.  A query Prometheus refuses stops the script, naming
the panel, the query and Prometheus' error: the dashboard's PromQL is checked on a real
Prometheus whenever a picture is made.

    pip install '.[dashboard]'
    python deploy/grafana/render.py --prometheus http://127.0.0.1:9090 --minutes 10 \\
        -o docs/images/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "orchestrator.json"
OUT = HERE.parents[1] / "docs" / "images" / "dashboard.png"

GRID_COLUMNS = 24
DPI = 100
# Grafana's dark theme, roughly: the picture should read as the dashboard it stands in for.
BACKGROUND, PANEL, TEXT, MUTED, GRID = "#111217", "#181b1f", "#ccccdc", "#8e8e9a", "#2c3235"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff780a", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a", "#37872d"]


class RenderError(Exception):
    """Prometheus could not be asked, or refused a query: the picture would lie, so none is made."""


@dataclass
class Series:
    label: str
    times: list[float]
    values: list[float]


def prom_duration(text: str) -> str:
    """``--rate-interval``: a PromQL duration, checked here rather than as a refused query."""
    if not re.fullmatch(r"\d+(ms|s|m|h|d)", text):
        raise argparse.ArgumentTypeError(f"a Prometheus duration such as 30s or 1m, not {text!r}")
    return text


def promql(expr: str, *, rate_interval: str, step_s: float, range_s: float) -> str:
    """The target's expression with Grafana's interval variables replaced (longest names first)."""
    for name, value in (
        ("$__rate_interval", rate_interval),
        ("${__rate_interval}", rate_interval),
        ("$__interval", f"{max(1, round(step_s))}s"),
        ("$__range", f"{max(1, round(range_s))}s"),
    ):
        expr = expr.replace(name, value)
    if "$" in expr:
        raise RenderError(f"a variable this script does not know is left in {expr!r}")
    return expr


def query_range(base_url: str, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
    """``/api/v1/query_range``'s result (a matrix), or :class:`RenderError` with Prometheus' own words."""
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s}"})
    url = f"{base_url.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        # Prometheus answers a bad query with 400 (or 422 for one it cannot run) and a JSON error.
        try:
            detail = json.loads(exc.read())
            reason = f"{detail.get('errorType')}: {detail.get('error')}"
        except (ValueError, AttributeError):
            reason = str(exc)
        raise RenderError(f"Prometheus refused the query (HTTP {exc.code}) {reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise RenderError(f"Prometheus at {base_url} did not answer: {exc}") from exc
    if body.get("status") != "success":
        raise RenderError(f"Prometheus answered {body.get('errorType')}: {body.get('error')}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise RenderError(f"Prometheus answered a {data.get('resultType')!r}, not a range (matrix)")
    result: list[dict[str, Any]] = data.get("result") or []
    return result


def legend(fmt: str, labels: dict[str, str], expr: str) -> str:
    """Grafana's ``legendFormat``: ``{{name}}`` replaced by the series' label (empty when it has none)."""
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else expr
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt).strip()


def panel_series(panel: dict[str, Any], args: argparse.Namespace, start: float, end: float) -> list[Series]:
    out: list[Series] = []
    for target in panel.get("targets", []):
        expr = promql(target["expr"], rate_interval=args.rate_interval, step_s=args.step, range_s=end - start)
        try:
            matrix = query_range(args.prometheus, expr, start, end, args.step)
        except RenderError as exc:
            raise RenderError(
                f"panel {panel.get('title')!r}, target {target.get('refId')}: {exc}\n  query: {expr}"
            ) from exc
        for item in matrix:
            times = [float(t) for t, _ in item["values"]]
            # Prometheus writes NaN (a quantile of no observations) as the string "NaN": a gap.
            values = [float(v) for _, v in item["values"]]
            out.append(Series(legend(target.get("legendFormat", ""), item.get("metric", {}), expr), times, values))
    return out


def fmt_value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "s":
        if value == 0:
            return "0 s"
        return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    suffix = " /s" if unit in ("ops", "reqps") else ""
    if value == int(value) and abs(value) < 1e6:
        return f"{int(value)}{suffix}"
    return f"{value:.3g}{suffix}"


def time_ticks(start: float, end: float, most: int) -> list[float]:
    """Ticks on whole minutes (or hours), at most ``most`` of them, in Unix seconds (UTC)."""
    for every in (60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if (end - start) / every <= most:
            break
    first = math.ceil(start / every) * every
    return [float(t) for t in range(int(first), int(end) + 1, every)]


def draw(dashboard: dict[str, Any], args: argparse.Namespace, start: float, end: float) -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise RenderError("matplotlib is missing: pip install '.[dashboard]'") from exc

    matplotlib.use("Agg")
    # Text as written: a PromQL variable, a caption or a label value with two "$" is no TeX.
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    from matplotlib.ticker import FuncFormatter

    panels = dashboard["panels"]
    unknown = sorted({p.get("type") for p in panels} - {"row", "timeseries"})
    if unknown:
        raise RenderError(f"panel types this script does not draw: {unknown} (it would leave them out silently)")
    # Ask everything before drawing anything: a refused query stops the script with no picture.
    data = {id(p): panel_series(p, args, start, end) for p in panels if p["type"] == "timeseries"}

    # Pixels, as Grafana lays a dashboard out: 24 columns over the width, 30 px per grid row.
    span = (
        f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M}-{datetime.fromtimestamp(end, UTC):%H:%M} UTC, "
        f"step {args.step:g} s, $__rate_interval = {args.rate_interval}"
    )
    width_px, unit_px, gutter, margin = args.width * DPI, 30.0, 8.0, 12.0
    # The caption wrapped to the width (about 7 px a character at 9 points, 100 dpi).
    lines = textwrap.wrap(f"{span}. {args.caption}" if args.caption else span, int((width_px - 2 * margin) / 7))
    header_px = 44.0 + 16 * len(lines)
    column_px = (width_px - 2 * margin) / GRID_COLUMNS
    height_px = header_px + max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) * unit_px + margin
    fig = plt.figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI, facecolor=BACKGROUND)

    def box(left: float, top: float, w: float, h: float) -> tuple[float, float, float, float]:
        """A rectangle in pixels from the top left corner, as a figure fraction."""
        return left / width_px, 1 - (top + h) / height_px, w / width_px, h / height_px

    fig.text(
        margin / width_px,
        1 - 22 / height_px,
        f"{dashboard.get('title', 'dashboard')}: real Prometheus data, "
        "drawn by deploy/grafana/render.py (a stand-in for a Grafana screenshot)",
        color=TEXT,
        fontsize=14,
        weight="bold",
        va="center",
    )
    for i, line in enumerate(lines):
        fig.text(margin / width_px, 1 - (46 + 16 * i) / height_px, line, color=MUTED, fontsize=9, va="center")

    for panel in panels:
        pos = panel["gridPos"]
        left = margin + pos["x"] * column_px + gutter / 2
        top = header_px + pos["y"] * unit_px + gutter / 2
        w, h = pos["w"] * column_px - gutter, pos["h"] * unit_px - gutter
        if panel["type"] == "row":
            fig.text(
                left / width_px,
                1 - (top + h / 2) / height_px,
                panel.get("title", ""),
                color=TEXT,
                fontsize=11,
                weight="bold",
                va="center",
            )
            continue
        card = FancyBboxPatch(
            box(left, top, w, h)[:2],
            w / width_px,
            h / height_px,
            transform=fig.transFigure,
            boxstyle="round,pad=0,rounding_size=0.002",
            facecolor=PANEL,
            edgecolor=GRID,
            linewidth=0.6,
            zorder=-1,
        )  # under the plot: axes are drawn at zorder 0
        fig.patches.append(card)
        fig.text(
            (left + 8) / width_px,
            1 - (top + 12) / height_px,
            panel.get("title", ""),
            color=TEXT,
            fontsize=9,
            weight="bold",
            va="center",
        )
        # Inside the card: the title's line above, tick labels left and below.
        ax = fig.add_axes(box(left + 58, top + 26, w - 68, h - 26 - 22), facecolor=PANEL)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        for side in ax.spines.values():
            side.set_visible(False)
        ax.tick_params(colors=MUTED, labelsize=7, length=0, pad=3)
        ax.grid(True, color=GRID, linewidth=0.5)
        ax.set_xlim(start, end)
        ax.set_xticks(time_ticks(start, end, max(2, int(w // 110))))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda t, _pos: f"{datetime.fromtimestamp(t, UTC):%H:%M}"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, u=unit: fmt_value(v, u)))
        series = data[id(panel)]
        if not series:
            ax.text(0.5, 0.5, "No data", color=MUTED, fontsize=10, ha="center", va="center", transform=ax.transAxes)
            ax.set_ylim(0, 1)
            ax.set_yticks([])
            continue
        fill = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("fillOpacity", 0) / 100
        for i, s in enumerate(sorted(series, key=lambda s: s.label)):
            colour = PALETTE[i % len(PALETTE)]
            real = [v for v in s.values if not math.isnan(v)]
            last = real[-1] if real else math.nan
            peak = max(real) if real else math.nan
            # The legend's table (lastNotNull, max) as one line per series.
            label = f"{s.label}   last {fmt_value(last, unit)}   max {fmt_value(peak, unit)}"
            ax.plot(s.times, s.values, color=colour, linewidth=1.1, label=label)
            if fill:
                ax.fill_between(s.times, s.values, color=colour, alpha=fill, linewidth=0)
        seen = [v for s in series for v in s.values if not math.isnan(v)]
        low, high = min(seen, default=0.0), max(seen, default=0.0)
        # From zero, as Grafana's soft minimum does, with room above the lines for the
        # legend, which Grafana puts below the plot; a flat zero gets an axis to 1.
        ax.set_ylim(min(0.0, low), (high if high > 0 else 1.0) * (1.1 + 0.12 * len(series)))
        ax.legend(
            loc="upper left",
            fontsize=6.5,
            frameon=False,
            labelcolor=TEXT,
            handlelength=1.2,
            borderaxespad=0.2,
            labelspacing=0.2,
        )
    return fig


def save(fig: Any, out: Path) -> None:
    """The PNG with a 256-colour palette: a third of the size of matplotlib's RGBA for a dark
    picture of flat fills and thin lines, with no visible loss (docs/images/ is in the repository)."""
    from PIL import Image  # matplotlib's own dependency

    fig.canvas.draw()
    rgba = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    rgba.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus' base URL")
    ap.add_argument("--dashboard", type=Path, default=DASHBOARD, help="the Grafana dashboard JSON")
    ap.add_argument("-o", "--out", type=Path, default=OUT, help="the PNG to write")
    ap.add_argument("--minutes", type=float, default=10.0, help="the range: this many minutes up to --end")
    ap.add_argument("--end", type=float, default=None, help="end of the range, Unix seconds (default: now)")
    ap.add_argument("--start", type=float, default=None, help="start of the range, Unix seconds (instead of --minutes)")
    ap.add_argument("--step", type=float, default=0.0, help="seconds between points (default: the range / 240)")
    ap.add_argument(
        "--rate-interval", type=prom_duration, default="1m", help="what $__rate_interval becomes (a PromQL duration)"
    )
    ap.add_argument("--width", type=float, default=16.0, help="the picture's width in inches (100 dpi)")
    ap.add_argument("--caption", default="", help="a line under the title: what traffic the picture shows")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    end = args.end if args.end is not None else time.time()
    start = args.start if args.start is not None else end - args.minutes * 60
    if start >= end:
        print("render: the range's start is not before its end", file=sys.stderr)
        return 2
    args.step = args.step or max(1.0, round((end - start) / 240))
    try:
        dashboard = json.loads(args.dashboard.read_text())
        fig = draw(dashboard, args, start, end)
    except (RenderError, OSError, ValueError, KeyError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
