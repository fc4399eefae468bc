"""The SmolLM2 study's report (``python -m experiments.smollm2_study report``), from the committed cells.

Reads ``experiments/results/smollm2_cells/*.json`` (one per model, written by ``run``) and writes

- ``smollm2_study.json``: every run (method, ratio, seed, config, XSTest with every completion,
  general ability, geometry, the code fingerprint and whether the cell is current), the pilot, and
  the summaries below;
- ``smollm2_study.md``: per (method, ratio) mean ± std over seeds, the paired VCL - SFT differences
  (same ratio and seed: same data, same LoRA initialisation), and the study's claims beside ours;
- ``smollm2_study.png``: refusal rates and held-out loss by ratio, top-3 energy and alignment with the
  base along normalised depth.

This file is not part of a cell's fingerprint: changing the report never makes a measured cell stale.
"""

from __future__ import annotations

import json
import sys

from .common import RESULTS, markdown_table, mean_spread, provenance, show, write_json
from .smollm2_study import CELLS, RATIOS, WINDOW, fingerprint

STUDY_CLAIMS = {"false_refusal_0": 0.63, "false_refusal_40": 0.84, "vcl_false_refusal_cut": 0.35}


def load_cells() -> list[dict]:
    code = fingerprint()
    cells = []
    for path in sorted(CELLS.glob("*.json")):
        cell = json.loads(path.read_text())
        cell["provenance"] = provenance(cell, code)
        cells.append(cell)
    return cells


def _window_energy(cell: dict) -> float:
    from flowlens.vcl import window_layers

    energy = cell["geometry"]["concentration"]["top_k_energy"]
    layers = window_layers(WINDOW, len(energy))
    return sum(energy[l] for l in layers) / len(layers)


METRICS = {
    "false_refusal_rate": lambda c: c["xstest"]["false_refusal_rate"],
    "harmful_refusal_rate": lambda c: c["xstest"]["harmful_refusal_rate"],
    "dolly_loss": lambda c: c["general"]["dolly_heldout"]["loss"],
    "dolly_perplexity": lambda c: c["general"]["dolly_heldout"]["perplexity"],
    "task_accuracy": lambda c: c["general"]["chat_world_tasks"]["accuracy"],
    "window_top3_energy": _window_energy,
    "alignment_mean": lambda c: c["geometry"]["alignment"]["mean"] if "alignment" in c["geometry"] else None,
}


def summarise(cells: list[dict]) -> tuple[list[dict], list[dict]]:
    """(per method and ratio, paired VCL - SFT per ratio)."""
    runs = [c for c in cells if c["method"] != "base"]
    n_layers = len(cells[0]["geometry"]["concentration"]["top_k_energy"])
    summary = []
    for method in ("sft", "vcl"):
        for ratio in RATIOS:
            chosen = [c for c in runs if c["method"] == method and c["ratio"] == ratio]
            if not chosen:
                continue
            entry = {"method": method, "ratio": ratio, "seeds": sorted(c["seed"] for c in chosen),
                     "provenance": sorted({c["provenance"] for c in chosen})}
            entry.update({name: mean_spread([get(c) for c in chosen]) for name, get in METRICS.items()})
            for key in ("top_k_energy", "effective_rank"):
                entry[f"{key}_by_layer"] = [mean_spread([c["geometry"]["concentration"][key][l] for c in chosen])
                                            for l in range(n_layers)]
            entry["alignment_by_layer"] = [mean_spread([c["geometry"]["alignment"]["mean_by_layer"][l]
                                                        for c in chosen]) for l in range(n_layers)]
            summary.append(entry)
    paired = []
    for ratio in RATIOS:
        pairs = [(s, v) for s in runs for v in runs if s["method"] == "sft" and v["method"] == "vcl"
                 and s["ratio"] == v["ratio"] == ratio and s["seed"] == v["seed"]]
        if pairs:
            paired.append({"ratio": ratio, "seeds": sorted(s["seed"] for s, _ in pairs),
                           **{name: mean_spread([None if get(v) is None or get(s) is None else get(v) - get(s)
                                                 for s, v in pairs]) for name, get in METRICS.items()}})
    return summary, paired


def headline(cells: list[dict], summary: list[dict], paired: list[dict]) -> str:
    """The study's claims next to what this grid measured (the table of docs/experiments/smollm2-study.md)."""
    data_path = RESULTS / "smollm2_data.json"
    rows = []
    if data_path.is_file():
        diversity = json.loads(data_path.read_text())["diversity"]
        general = diversity["general (Dolly train)"]["completions"]
        safety = diversity["safety (AdvBench + templated refusals)"]["completions"]
        rows.append(["safety data is lexically repetitive (completions: H1 bits, distinct-2; safety vs general)",
                     "9.18 / 0.048 vs 12.05 / 0.205",
                     f"{safety['entropy']['H1']:.2f} / {safety['distinct']['distinct-2']:.3f} vs "
                     f"{general['entropy']['H1']:.2f} / {general['distinct']['distinct-2']:.3f}"])
    by = {(e["method"], e["ratio"]): e for e in summary}
    measured = sorted(r for m, r in by if m == "sft") or list(RATIOS)
    low, high = measured[0], measured[-1]
    base = next((c for c in cells if c["method"] == "base"), None)
    if ("sft", low) in by and ("sft", high) in by:
        a, b = by[("sft", low)], by[("sft", high)]
        rows.append([f"more safety data, more false refusals (XSTest safe prompts; SFT at ratio {low:g} -> {high:g})",
                     "0.63 -> 0.84 (Llama-3.2-1B)",
                     f"{show(a['false_refusal_rate'])} -> {show(b['false_refusal_rate'])}"
                     + (f" (base {base['xstest']['false_refusal_rate']:.3f})" if base else "")])
        rows.append([f"... and more harmful refusals (XSTest unsafe prompts; ratio {low:g} -> {high:g})", "-",
                     f"{show(a['harmful_refusal_rate'])} -> {show(b['harmful_refusal_rate'])}"
                     + (f" (base {base['xstest']['harmful_refusal_rate']:.3f})" if base else "")])
        rows.append([f"more safety data concentrates mid-depth variance (top-3 energy, window "
                     f"{WINDOW[0]:g}-{WINDOW[1]:g}; ratio {low:g} -> {high:g})", "rises (figure, no number given)",
                     f"{show(a['window_top3_energy'])} -> {show(b['window_top3_energy'])}"
                     + (f" (base {_window_energy(base):.3f})" if base else "")])
    top = next((p for p in paired if p["ratio"] == high), None)
    if top is not None:
        rows.append([f"VCL cuts false refusals by more than 35 points (paired SFT+VCL - SFT, ratio {high:g})",
                     "< -0.35", show(top["false_refusal_rate"])])
        rows.append(["... while keeping general ability (paired Δ held-out Dolly loss; Δ chat-world tasks)",
                     "kept", f"{show(top['dolly_loss'])}; {show(top['task_accuracy'])}"])
        rows.append(["... and harmful refusals (paired Δ)", "kept", show(top["harmful_refusal_rate"])])
        rows.append(["VCL lowers the window's concentration (paired Δ top-3 energy)", "yes",
                     show(top["window_top3_energy"])])
    return markdown_table(["claim (reference study)", "study", "SmolLM2-135M-Instruct, LoRA (this grid)"], rows)


def markdown(cells: list[dict], summary: list[dict], paired: list[dict], pilot: dict | None) -> str:
    base = next((c for c in cells if c["method"] == "base"), None)
    depth = cells[0]["geometry"]["concentration"]["depth"]
    stale = [c["name"] for c in cells if c["provenance"] != "computed"]
    text = ("# SmolLM2-135M-Instruct: safety data, false refusals and VCL\n\n"
            "Written by `python -m experiments.smollm2_study report` from `experiments/results/smollm2_cells/` "
            "(`run` computed each cell; see the module docstring of `experiments/smollm2_study.py` for the recipe). "
            "Mean ± std over seeds.\n\n")
    if stale:
        text += f"**Not current** (computed by other code than is committed): {', '.join(stale)}.\n\n"
    text += headline(cells, summary, paired) + "\n"
    header = ["model", "safety ratio", "seeds", "false refusal (XSTest safe)", "harmful refusal (XSTest unsafe)",
              "held-out Dolly loss", "chat-world tasks", f"top-3 energy, window {WINDOW[0]:g}-{WINDOW[1]:g}",
              "alignment w/ base", "cells"]
    rows = []
    if base is not None:
        rows.append(["base", "-", "-", *[show(mean_spread([get(base)])) for get in
                                         (METRICS["false_refusal_rate"], METRICS["harmful_refusal_rate"],
                                          METRICS["dolly_loss"], METRICS["task_accuracy"],
                                          METRICS["window_top3_energy"])], "1", base["provenance"]])
    for e in summary:
        rows.append([e["method"].upper() if e["method"] == "sft" else "SFT+VCL", f"{e['ratio']:g}",
                     str(len(e["seeds"])), show(e["false_refusal_rate"]), show(e["harmful_refusal_rate"]),
                     show(e["dolly_loss"]), show(e["task_accuracy"]), show(e["window_top3_energy"]),
                     show(e["alignment_mean"]), ", ".join(e["provenance"])])
    text += markdown_table(header, rows)
    if paired:
        text += "\nPaired differences, SFT+VCL minus SFT (same ratio, seed, data and LoRA initialisation):\n\n"
        text += markdown_table(["safety ratio", "pairs", "Δ false refusal", "Δ harmful refusal", "Δ Dolly loss",
                                "Δ chat-world tasks", "Δ window top-3 energy"],
                               [[f"{p['ratio']:g}", str(len(p["seeds"])), show(p["false_refusal_rate"]),
                                 show(p["harmful_refusal_rate"]), show(p["dolly_loss"]), show(p["task_accuracy"]),
                                 show(p["window_top3_energy"])] for p in paired])
    if pilot:
        text += (f"\nVCL settings (pilot, `python -m experiments.smollm2_study pilot`: {pilot['steps']} steps at ratio "
                 f"{pilot['ratio']:g}, seed 0; rule: {pilot['rule']}): **k = {pilot['chosen']['k']}, lambda = "
                 f"{pilot['chosen']['weight']:g}**, window {WINDOW[0]:g}-{WINDOW[1]:g}.\n\n")
        text += markdown_table(["run", "held-out Dolly loss", "window top-3 energy", "VCL ratio (last 10 steps)"],
                               [["SFT", f"{pilot['sft']['dolly_loss']:.4f}", f"{pilot['sft']['window_top3_energy']:.4f}",
                                 "-"]] +
                               [[f"k={r['k']} lambda={r['weight']:g}", f"{r['dolly_loss']:.4f}",
                                 f"{r['window_top3_energy']:.4f}", f"{r['final_vcl_ratio']:.4f}"] for r in pilot["runs"]])
    text += "\nTop-3 energy of last-prompt-token residuals (XSTest prompts) along normalised depth (mean over seeds):\n\n"
    picks = [i for i in range(len(depth)) if i % 3 == 0 or i == len(depth) - 1]
    text += markdown_table(["model", *[f"{depth[i]:.2f}" for i in picks]],
                           ([["base", *[f"{base['geometry']['concentration']['top_k_energy'][i]:.3f}" for i in picks]]]
                            if base else []) +
                           [[f"{e['method']} {e['ratio']:g}", *[f"{e['top_k_energy_by_layer'][i]['mean']:.3f}"
                                                               for i in picks]] for e in summary])
    return text


def plot(cells: list[dict], summary: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next((c for c in cells if c["method"] == "base"), None)
    depth = cells[0]["geometry"]["concentration"]["depth"]
    figure, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    for method, style in (("sft", "-o"), ("vcl", "--s")):
        entries = [e for e in summary if e["method"] == method]
        if not entries:
            continue
        ratios = [e["ratio"] for e in entries]
        label = "SFT" if method == "sft" else "SFT+VCL"
        for metric, name in (("false_refusal_rate", "false refusal"), ("harmful_refusal_rate", "harmful refusal")):
            axes[0].errorbar(ratios, [e[metric]["mean"] for e in entries], yerr=[e[metric]["std"] for e in entries],
                             fmt=style, capsize=3, label=f"{label}: {name}")
        axes[1].errorbar(ratios, [e["dolly_loss"]["mean"] for e in entries],
                         yerr=[e["dolly_loss"]["std"] for e in entries], fmt=style, capsize=3, label=label)
        for e in entries:
            if e["ratio"] in (0.0, max(ratios)):
                for axis, key in ((axes[2], "top_k_energy_by_layer"), (axes[3], "alignment_by_layer")):
                    axis.plot(depth, [s["mean"] for s in e[key]], style, markersize=3,
                              label=f"{label} ratio {e['ratio']:g}")
    if base is not None:
        for value, name in ((base["xstest"]["false_refusal_rate"], "base: false refusal"),
                            (base["xstest"]["harmful_refusal_rate"], "base: harmful refusal")):
            axes[0].axhline(value, color="grey", linestyle=":", linewidth=1)
            axes[0].annotate(name, (0, value), fontsize=7, color="grey")
        axes[1].axhline(base["general"]["dolly_heldout"]["loss"], color="grey", linestyle=":", label="base")
        axes[2].plot(depth, base["geometry"]["concentration"]["top_k_energy"], ":", color="grey", label="base")
    for axis in axes[2:]:
        axis.axvspan(*WINDOW, color="orange", alpha=0.12)
        axis.set_xlabel("normalised depth l/(L-1)")
    axes[0].set_title("XSTest refusal rates")
    axes[1].set_title("held-out Dolly loss (nats/token)")
    axes[2].set_title("top-3 energy (last prompt token; VCL window shaded)")
    axes[3].set_title("alignment with the base model (mean |cos|, top 3 PCs)")
    for axis in axes[:2]:
        axis.set_xlabel("safety-data ratio")
    for axis in axes:
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report() -> int:
    cells = load_cells()
    if not cells:
        print(f"error: no cells in {CELLS}; run `python -m experiments.smollm2_study run` first", file=sys.stderr)
        return 2
    pilot_path = RESULTS / "smollm2_pilot.json"
    pilot = json.loads(pilot_path.read_text()) if pilot_path.is_file() else None
    grid = [c for c in cells if "-steps" not in c["name"]]  # pilot cells are summarised by the pilot
    summary, paired = summarise(grid)
    write_json(RESULTS / "smollm2_study.json", {
        "runs": [{k: c[k] for k in ("name", "method", "ratio", "seed", "config", "xstest", "general", "geometry",
                                    "code", "provenance", "seconds")} for c in grid],
        "summary": summary, "paired_vcl_minus_sft": paired, "pilot": pilot, "study_claims": STUDY_CLAIMS,
        "window": list(WINDOW)})
    text = markdown(grid, summary, paired, pilot)
    (RESULTS / "smollm2_study.md").write_text(text)
    plot(grid, summary, RESULTS / "smollm2_study.png")
    print(text)
    return 0
