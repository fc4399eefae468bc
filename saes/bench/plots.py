"""SAEBench's standard plot: metrics against L0, one point per SAE, from `saes bench` result files.

    python -m saes.bench.plots --results saes/pretrained/toy-chat saes/pretrained/smollm2 --out docs/saebench \
        --plotlyjs cdn

reads every `*_eval_results.json` below each --results folder (core and sparse_probing), and writes
`<out>/metrics_vs_l0.png` (matplotlib) and `<out>/metrics_vs_l0.html` (plotly, standalone) with one panel per
metric: ce_loss_score, kl_div_score, explained_variance (SAEBench's) and sae_top_1_test_accuracy, each against the
core eval's L0 (log x, as SAEBench draws it). SAEs of one model, architecture and results folder are one series
(a line through their points in order of L0, as SAEBench draws each trainer's sweep); the folder is named in the
legend only where a model has one architecture in several folders (e.g. the shipped SAE beside a sweep trained on
another budget). Prints a markdown table of the headline metrics, one row per SAE.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PANELS = (("core", "model_performance_preservation", "ce_loss_score", "CE loss score"),
          ("core", "model_behavior_preservation", "kl_div_score", "KL divergence score"),
          ("core", "reconstruction_quality", "explained_variance", "explained variance (SAEBench 0.6.0)"),
          ("sparse_probing", "sae", "sae_top_1_test_accuracy", "sparse probing: top-1 latent accuracy"))


def collect(roots) -> list[dict]:
    """One row per SAE: its label, L0, architecture, results folder ("source") and the panels' metrics (None where
    its eval is missing), and "group": the series it is drawn in (see the module's docstring)."""
    rows: dict[tuple, dict] = {}
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise ValueError(f"no results folder {root}")
        for path in sorted(root.rglob("*_eval_results.json")):
            result = json.loads(path.read_text())
            cfg = result.get("sae_cfg_dict") or {}
            key = (cfg.get("model_name"), result.get("sae_lens_id"))
            trained = (cfg.get("metadata") or {}).get("architecture_trained") or cfg.get("architecture")
            row = rows.setdefault(key, {"model": key[0], "sae": key[1], "architecture": trained,
                                        "d_sae": cfg.get("d_sae"), "l0": None, "source": _source(root)})
            metrics = result["eval_result_metrics"]
            flat = {k: v for category in metrics.values() for k, v in category.items()}
            row.update({f"{result['eval_type_id']}:{k}": v for k, v in flat.items()})
            unstructured = result.get("eval_result_unstructured") or {}
            row[f"{result['eval_type_id']}:wall_seconds"] = unstructured.get("wall_seconds")
            row[f"{result['eval_type_id']}:cpu_seconds"] = unstructured.get("cpu_seconds")
            if result["eval_type_id"] == "core":
                row["l0"] = metrics["sparsity"]["l0"]
                row["core:ev_textbook"] = (unstructured.get("textbook") or {}).get("explained_variance_1_minus_fvu")
            for eval_type, category, name, _ in PANELS:
                if result["eval_type_id"] == eval_type:
                    row[name] = metrics[category].get(name)
    found = [r for r in rows.values() if r["l0"] is not None]
    if not found:
        raise ValueError(f"no core result (*_eval_results.json) under {', '.join(map(str, roots))}: run saes bench "
                         f"--evals core first")
    return group_rows(found)


def _source(root: Path) -> str:
    """A results folder's name in a legend: "shipped" for the results beside an SAE under saes/pretrained."""
    return "shipped" if "pretrained" in root.resolve().parts else root.name


def group_rows(rows: list[dict]) -> list[dict]:
    """Set each row's "group" (model / architecture, and its results folder where the model has that architecture in
    several folders); rows sorted by group, then L0."""
    sources: dict[tuple, set] = {}
    for row in rows:
        sources.setdefault((row["model"], row["architecture"]), set()).add(row.get("source"))
    for row in rows:
        many = len(sources[(row["model"], row["architecture"])]) > 1
        row["group"] = f"{row['model']} / {row['architecture']}" + (f" [{row.get('source')}]" if many else "")
    return sorted(rows, key=lambda r: (r["group"], r["l0"]))


TABLE = (("L0", "l0", "{:.1f}"), ("CE score", "core:ce_loss_score", "{:.3f}"),
         ("KL score", "core:kl_div_score", "{:.3f}"), ("EV (SAEBench)", "core:explained_variance", "{:.3f}"),
         ("EV (1 - FVU)", "core:ev_textbook", "{:.3f}"), ("cossim", "core:cossim", "{:.3f}"),
         ("L2 ratio", "core:l2_ratio", "{:.3f}"), ("rel. bias", "core:relative_reconstruction_bias", "{:.3f}"),
         ("alive", "core:frac_alive", "{:.3f}"), (">1%", "core:freq_over_1_percent", "{:.3f}"),
         ("max enc cos", "core:average_max_encoder_cosine_sim", "{:.3f}"),
         ("max dec cos", "core:average_max_decoder_cosine_sim", "{:.3f}"),
         ("LLM probe", "sparse_probing:llm_test_accuracy", "{:.3f}"),
         ("SAE probe", "sparse_probing:sae_test_accuracy", "{:.3f}"),
         ("LLM top-1", "sparse_probing:llm_top_1_test_accuracy", "{:.3f}"),
         ("SAE top-1", "sparse_probing:sae_top_1_test_accuracy", "{:.3f}"),
         ("SAE top-2", "sparse_probing:sae_top_2_test_accuracy", "{:.3f}"),
         ("SAE top-5", "sparse_probing:sae_top_5_test_accuracy", "{:.3f}"),
         ("SAE top-20", "sparse_probing:sae_top_20_test_accuracy", "{:.3f}"))
# the later evals' headline metrics (the UI's table shows them after TABLE's; the markdown table of docs/saebench.md
# is TABLE's): absorption's scores, SCR and TPP at 20 latents ablated
LATER_EVALS = (("absorption", "absorption_first_letter:mean_absorption_fraction_score", "{:.3f}"),
               ("full absorption", "absorption_first_letter:mean_full_absorption_score", "{:.3f}"),
               ("SCR (20)", "scr:scr_metric_threshold_20", "{:.3f}"),
               ("TPP (20)", "tpp:tpp_threshold_20_total_metric", "{:.3f}"))


def markdown_table(rows) -> str:
    """One row per SAE: the headline metrics (SAEBench's names; EV (1 - FVU) from eval_result_unstructured)."""
    head = "| SAE | " + " | ".join(name for name, _, _ in TABLE) + " |"
    lines = [head, "|---|" + "---:|" * len(TABLE)]
    for row in rows:
        cells = ["n/a" if row.get(key) is None else fmt.format(row[key]) for _, key, fmt in TABLE]
        lines.append(f"| {row['model']} / {row['sae']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def label(row: dict) -> str:
    return f"{row['model']} / {row['sae']} ({row['architecture']}, {row['d_sae']})"


def _series(rows, group=None) -> dict[str, list[dict]]:
    """{series name: its rows in order of L0}: group(row) when a function is given (e.g. the image SAEs' trainer,
    drawn as points), else a row's "group" (collect's: a sweep, drawn as a line), or the row alone under its label."""
    series: dict[str, list[dict]] = {}
    for row in rows:
        name = group(row) if group is not None else (row.get("group") or label(row))
        series.setdefault(name, []).append(row)
    return {name: sorted(members, key=lambda r: r["l0"]) for name, members in series.items()}


def _colours(n: int) -> list[str]:
    return [f"C{i % 10}" for i in range(n)]  # matplotlib's cycle


def write_png(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from interp.atomic import atomic_write

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.8))
    series = _series(rows)
    for ax, (_, _, name, title) in zip(axes, PANELS):
        for (group, members), colour in zip(series.items(), _colours(len(series))):
            points = [(r["l0"], r[name]) for r in members if r.get(name) is not None]
            if points:
                ax.plot(*zip(*points), "-o", ms=5, lw=1.2, color=colour, label=group)
        ax.set_xscale("log")
        ax.set_xlabel("L0")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(3, max(1, len(labels))), fontsize=8)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)


# the panels as (row key, title): every row holds its metrics as "<eval_type_id>:<metric>"
LM_PANELS = tuple((f"{eval_type}:{name}", title) for eval_type, _, name, title in PANELS)


def figure(rows, panels=LM_PANELS, title: str = "SAEBench metrics against L0 (saes bench)", width: int | None = 0,
           group=None):
    """The plotly figure of SAEBench's standard plot: one panel per (row key, title) of `panels`, each SAE a point
    at (its L0, the metric), log x. width: pixels (0: 360 a panel; None: the page's). group: a function of a row
    naming its legend entry and colour (e.g. its trainer), shared by the rows it names alike; None: one per SAE."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[1] for p in panels])
    series = _series(rows, group)
    for col, (key, _) in enumerate(panels, 1):
        for i, (name, members) in enumerate(series.items()):
            members = [r for r in members if r.get(key) is not None]
            if not members:
                continue
            colour = f"hsl({(i * 137) % 360},60%,45%)"
            fig.add_trace(go.Scatter(x=[r["l0"] for r in members], y=[r[key] for r in members],
                                     mode="lines+markers" if group is None and len(members) > 1 else "markers",
                                     name=name, legendgroup=name, showlegend=col == 1, text=[r["sae"] for r in members],
                                     hovertemplate="%{text}<br>L0 %{x:.1f}<br>%{y:.3f}",
                                     marker={"size": 9, "color": colour}, line={"color": colour}),
                          row=1, col=col)
        fig.update_xaxes(type="log", title_text="L0", row=1, col=col)
    fig.update_layout(height=420, title=title, **({} if width is None else {"width": width or 360 * len(panels)}))
    return fig


def write_html(rows, path: Path, plotlyjs: str = "inline") -> None:
    from interp.atomic import atomic_write_text

    fig = figure(rows)
    include = True if plotlyjs == "inline" else "cdn"  # cdn: a small page that loads plotly.js from its CDN
    atomic_write_text(path, fig.to_html(include_plotlyjs=include, full_html=True))


def main(argv=None) -> int:
    from interp.cli import add_out_argument, run_command
    from interp.shipped import add_overwrite_options

    parser = argparse.ArgumentParser(prog="python -m saes.bench.plots", description=__doc__.split("\n")[0])
    parser.add_argument("--results", nargs="+", required=True, help="folders holding saes bench results")
    add_out_argument(parser, required=True, help="folder for metrics_vs_l0.png and metrics_vs_l0.html")
    parser.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                        help="inline: a standalone page (about 5 MB); cdn: a small page that loads plotly.js")

    def run(args) -> int:
        rows = collect(args.results)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_png(rows, out / "metrics_vs_l0.png")
        write_html(rows, out / "metrics_vs_l0.html", args.plotlyjs)
        print(markdown_table(rows), end="")
        print(f"wrote {out / 'metrics_vs_l0.png'} and {out / 'metrics_vs_l0.html'} ({len(rows)} SAEs)")
        return 0

    parser.set_defaults(run=run)
    return run_command(add_overwrite_options(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
