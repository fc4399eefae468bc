"""A fine-tuning run's log (`log.jsonl`: one line per step, as `flowlens.finetune` writes it): appending, trimming
back to a checkpoint, reading while the run writes it, and the loss curves drawn from it (the UI's VCL tab)."""

from __future__ import annotations

import json
from pathlib import Path

from interp.atomic import atomic_write_text


def append_log(path: Path, entry: dict) -> None:
    """One step's entry as a line of the log."""
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")


def trim_log(path: Path, step: int) -> None:
    """Drop log lines of steps after the checkpoint (they will be redone)."""
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_log(out: str | Path) -> list[dict]:
    """The entries of ``out/log.jsonl`` written so far (safe to call while the run writes it)."""
    path = Path(out) / "log.jsonl"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written right now: read it next time
    return entries


def thinned(entries: list[dict], max_points: int | None) -> list[dict]:
    """At most ``max_points`` entries, evenly spaced, the first and the last always among them (all when fewer)."""
    if max_points is None or len(entries) <= max_points:
        return entries
    last = len(entries) - 1
    picks = sorted({round(i * last / (max_points - 1)) for i in range(max_points)})
    return [entries[i] for i in picks]


def loss_curves_figure(entries: list[dict], title: str = "Fine-tuning loss", max_points: int | None = None):
    """Interactive (plotly) curves of the SFT and VCL terms (and their weighted sum) per step; with
    ``max_points``, drawn through at most that many evenly spaced steps (a live view of a long run: the UI
    re-sent 2,000 steps' markers a few times a second and the page froze)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    entries = thinned(entries, max_points)
    steps = [e["step"] for e in entries]
    mode = "lines+markers" if len(entries) <= 100 else "lines"
    for key, name in (("sft_loss", "SFT"), ("vcl_loss", "VCL"), ("loss", "total (SFT + lambda VCL)")):
        if any(key in e for e in entries):
            fig.add_trace(go.Scatter(x=steps, y=[e.get(key) for e in entries], mode=mode, name=name))
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="loss", height=360)
    return fig
