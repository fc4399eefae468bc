"""Tables and plots of a run directory (see `riebench.runner`).

- categories.md / categories.csv: per configuration and category, mean success,
  preservation, pixel distance outside the edit regions, distance to the exact target;
- headline.md: per category, the best success of each method among its configurations
  whose preservation is at least `min_preservation` (methods compared at equal
  preservation), and the prompt swap beside them; the same per method and single block
  (per-block runs: which blocks matter for which category);
- blocks.md / blocks.csv: per configuration and category, the share of selected units
  (SAE features, neurons) that come from each block;
- tradeoff.png / tradeoff.html: success against preservation over the sweep of k_trans
  and m, one curve per method (matplotlib and an interactive plotly page);
- report.json: all of the above as data, plus failed tasks and skipped metrics.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from interp.atomic import atomic_write_text
from interp.cli import probability

from .methods import MethodConfig
from .runner import check_run_dir, load_results

MAIN_METRICS = ("success", "preservation", "outside_pixel_distance", "target_distance")


def _config_id(result: dict) -> tuple:
    """(label, k_trans, m, method name, single block or None) of a result, from its configuration."""
    config = MethodConfig.from_dict(result["config"])
    if not config.edits_blocks:  # the prompt swap: one configuration whatever its knobs
        return (config.method_name, 0, 0.0, config.method_name, None)
    return (result["label"], config.k_trans, config.multiplier, config.method_name, config.block)


def _is_reference(method_name: str) -> bool:
    """A method that edits no block (the prompt swap): the reference the others are measured against, kept
    whatever its preservation and drawn apart in the plots (`Method.edits_blocks`)."""
    from .methods import METHODS

    return not METHODS[method_name].edits_blocks if method_name in METHODS else False


def category_table(results: list[dict]) -> list[dict]:
    """One row per (configuration, category) and per configuration over all categories."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[_config_id(r) + (r["category"],)].append(r)
        groups[_config_id(r) + ("all",)].append(r)
    rows = []
    for (label, k, m, name, block, category), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][5] == "all", kv[0][5])):
        row = {"method": label, "k_trans": k, "m": m, "category": category, "n": len(rs), "method_name": name,
               "block": block, "reference": _is_reference(name)}
        for metric in sorted({key for r in rs for key in r["metrics"]}):
            values = [r["metrics"][metric] for r in rs if metric in r["metrics"]]
            row[metric] = float(np.mean(values)) if values else None
        rows.append(row)
    return rows


def headline_table(rows: list[dict], min_preservation: float) -> list[dict]:
    """Per category and method: the best success among configurations preserving at least the threshold."""
    best: dict[tuple, dict] = {}
    for row in rows:
        if "success" not in row or row.get("preservation") is None:
            continue
        method = row["method"]
        if not row.get("reference") and row["preservation"] < min_preservation:
            continue
        key = (row["category"], method)
        if key not in best or row["success"] > best[key]["success"]:
            best[key] = row
    return [best[k] for k in sorted(best)]


def best_matrix(headline: list[dict], per_block: bool) -> list[dict]:
    """The headline as one row per method (per_block False: configurations on all their blocks) or per
    method and single block (per_block True) and one column per category: the best success at the
    preservation threshold, with the k_trans and m that gave it ("0" where no configuration edited).
    Answers which method edits best per category, and which blocks matter for which category."""
    cells: dict[tuple[str, str | None], dict] = defaultdict(dict)
    for row in headline:
        # one block: the method's name and that block; several: the label, which names them
        method, block = (row["method"], None) if row["block"] is None else (row["method_name"], row["block"])
        if (block is not None) != per_block:
            continue
        if row["success"] == 0:
            text = "0"
        elif row.get("reference"):
            text = f"{row['success']:.2f}"
        else:
            text = f"{row['success']:.2f} (k {row['k_trans']}, m {row['m']:g})"
        cells[(method, block)][row["category"]] = text
    categories = sorted({c for entry in cells.values() for c in entry}, key=lambda c: (c == "all", c))
    rows = []
    for (method, block), entry in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        head = {"method": method, "block": block} if per_block else {"method": method}
        rows.append({**head, **{c: entry.get(c, "–") for c in categories}})  # –: none preserved enough
    return rows


def block_table(results: list[dict]) -> list[dict]:
    """Share of selected units per block, per (configuration, category)."""
    counts: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        for unit in r.get("selected", []):
            for category in (r["category"], "all"):
                counts[_config_id(r) + (category,)][unit["block"]] += 1
    rows = []
    for (label, k, m, _, _, category), per_block in sorted(counts.items()):
        total = sum(per_block.values())
        row = {"method": label, "k_trans": k, "m": m, "category": category, "units": total}
        row.update({block: count / total for block, count in sorted(per_block.items())})
        rows.append(row)
    return rows


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def to_markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no results)\n"
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def tradeoff_curves(rows: list[dict]) -> dict[str, list[dict]]:
    """Method -> points (k_trans, m, success, preservation) over all categories, ordered for a curve."""
    curves: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row["category"] == "all" and row.get("success") is not None and row.get("preservation") is not None:
            curves[row["method"]].append({k: row.get(k) for k in ("k_trans", "m", "success", "preservation", "block",
                                                                "reference")})
    for points in curves.values():
        points.sort(key=lambda p: (-p["preservation"], p["success"]))
    return dict(curves)


def pareto_front(points: list[dict]) -> list[dict]:
    """The configurations no other beats on both success and preservation, by falling preservation:
    the method's best trade-off, drawn as its curve (every configuration is drawn as a point)."""
    front, best = [], -1.0
    for point in sorted(points, key=lambda p: (-p["preservation"], -p["success"])):
        if point["success"] > best:
            front.append(point)
            best = point["success"]
    return front


AXIS_RANGE = (-0.06, 1.06)  # the trade-off plots' axes: success and preservation are in [0, 1]


def tradeoff_figure(curves: dict[str, list[dict]]):
    """The interactive (plotly) success-against-preservation plot: one curve per method, hover k_trans and m."""
    import plotly.graph_objects as go

    from plotly.colors import qualitative

    fig = go.Figure()
    for i, (method, points) in enumerate(sorted(curves.items())):
        colour = qualitative.Plotly[i % len(qualitative.Plotly)]
        text = [f"k_trans={p['k_trans']} m={p['m']:g}" for p in points]
        fig.add_trace(go.Scatter(x=[p["preservation"] for p in points], y=[p["success"] for p in points],
                                 mode="markers", marker={"size": 14 if points[0].get("reference") else 8, "color": colour},
                                 name=method, legendgroup=method, text=text,
                                 hovertemplate="%{text}<br>preservation %{x:.3f}<br>success %{y:.3f}"))
        if not points[0].get("reference"):
            front = pareto_front(points)
            fig.add_trace(go.Scatter(x=[p["preservation"] for p in front], y=[p["success"] for p in front],
                                     mode="lines", legendgroup=method, showlegend=False, hoverinfo="skip",
                                     line={"color": colour}))
    # Both axes run to AXIS_RANGE, so that a point at 0 or 1 (the prompt swap's preservation) is drawn whole;
    # the legend goes below the plot, so that long method labels do not take the data area's width.
    fig.update_layout(xaxis_title="preservation", yaxis_title="edit success",
                      xaxis_range=list(AXIS_RANGE), yaxis_range=list(AXIS_RANGE),
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.2, "yanchor": "top"},
                      margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      title="RIEBench: success vs preservation over k_trans and m")
    return fig


def tradeoff_matplotlib(curves: dict[str, list[dict]]):
    """The static (matplotlib) plot of tradeoff.png: the methods on their full block sets, the legend below
    the axes (not over the data), both axes to AXIS_RANGE so that points at 0 and 1 are drawn whole."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one curve per method on its full block set; single-block runs are in headline.md and the HTML
    shown = {m: pts for m, pts in curves.items() if pts[0]["block"] is None} or curves
    fig, ax = plt.subplots(figsize=(7, 5.5))
    for method, points in sorted(shown.items()):
        xs, ys = [p["preservation"] for p in points], [p["success"] for p in points]
        if points[0].get("reference"):
            ax.scatter(xs, ys, marker="*", s=160, color="black", label=method, zorder=3)
        else:  # every configuration as a point, the Pareto front as the curve
            front = pareto_front(points)
            (line,) = ax.plot([p["preservation"] for p in front], [p["success"] for p in front], marker="o",
                              label=method)
            ax.scatter(xs, ys, s=14, alpha=0.4, color=line.get_color())
    ax.set_xlabel("preservation (other attributes unchanged)")
    ax.set_ylabel("edit success")
    ax.set_xlim(*AXIS_RANGE)
    ax.set_ylim(*AXIS_RANGE)
    ax.grid(alpha=0.3)
    ax.set_title("RIEBench: success vs preservation over k_trans and m", fontsize=10)
    if shown:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=min(3, len(shown)),
                  frameon=False)
    fig.tight_layout()
    return fig


def plot_tradeoff(curves: dict[str, list[dict]], png: Path, html: Path) -> list[str]:
    """Write the PNG (matplotlib) and HTML (plotly); returns what could not be written and why."""
    problems = []
    try:
        import matplotlib.pyplot as plt

        fig = tradeoff_matplotlib(curves)
        fig.savefig(png, dpi=120, bbox_inches="tight")
        plt.close(fig)
    except ImportError as err:
        problems.append(f"tradeoff.png: {err}")
    try:
        tradeoff_figure(curves).write_html(str(html), include_plotlyjs=True)
    except ImportError as err:
        problems.append(f"tradeoff.html: {err}")
    return problems


def write_report(out: str | os.PathLike, min_preservation: float = 0.9, plots: bool = True) -> dict:
    """Read a run directory's results and write the tables and plots into it; returns report.json's data."""
    out = Path(out)
    results, failed = load_results(out)
    rows = category_table(results)
    headline = headline_table(rows, min_preservation)
    blocks = block_table(results)
    curves = tradeoff_curves(rows)
    skipped = sorted({f"{k}: {v}" for r in results for k, v in r.get("skipped_metrics", {}).items()})
    main_columns = ["method", "k_trans", "m", "category", "n"] + [c for c in MAIN_METRICS if any(c in r for r in rows)]
    atomic_write_text(out / "categories.md", to_markdown(rows, main_columns))
    atomic_write_text(out / "categories.csv", to_csv(rows))
    methods, by_block = best_matrix(headline, per_block=False), best_matrix(headline, per_block=True)
    atomic_write_text(out / "headline.md", f"Best success per category and method at preservation >= "
                      f"{min_preservation:g} (prompt swap: as it is), with the k_trans and m that gave it; "
                      f"0: no configuration edited; –: none kept preservation >= {min_preservation:g}\n\n"
                      + to_markdown(methods)
                      + ("\nThe same, each method restricted to one block:\n\n" + to_markdown(by_block) if by_block else "")
                      + "\nThe configurations behind each cell:\n\n" + to_markdown(headline, main_columns))
    atomic_write_text(out / "blocks.md", to_markdown(blocks))
    atomic_write_text(out / "blocks.csv", to_csv(blocks) if blocks else "")
    problems = plot_tradeoff(curves, out / "tradeoff.png", out / "tradeoff.html") if plots and curves else []
    report = {"results": len(results), "failed": [{"task": f["task"], "label": f["label"], "error": f["error"]}
                                                  for f in failed],
              "skipped_metrics": skipped, "categories": rows, "headline": headline, "blocks": blocks,
              "best_by_method": methods, "best_by_block": by_block,
              "curves": curves, "plot_problems": problems, "min_preservation": min_preservation}
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    return report


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """`riebench report`: the run directory and the headline's preservation."""
    parser.add_argument("out")
    parser.add_argument("--min-preservation", type=probability, default=0.9, help="0 to 1")


def report_command(args) -> int:
    """`python -m riebench report DIR`: (re)write the tables and plots of a run directory."""
    check_run_dir(args.out)
    report = write_report(args.out, min_preservation=args.min_preservation)
    print(f"{report['results']} results, {len(report['failed'])} failed; tables and plots in {args.out}")
    return 0
