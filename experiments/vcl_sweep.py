"""Issue 7 experiment: plain SFT against SFT + VCL on the embedded chat model, resumable.

Every run fine-tunes the shipped base model (``zoo/weights/chat-base``, pre-trained without
refusals) with ``flowlens.finetune`` on a fixed chat-world mixture of general tasks and harmful
requests answered by refusals, at safety ratio r. A plain-SFT run is the same run with lambda 0.

The full product (3 ratios x k x lambda x window x sign x seeds) does not fit the CPU this was
run on, so the grid is one factor at a time around a default (k=2, lambda=1, window [0.3, 0.5],
penalize): the main comparison (plain SFT and the default, 3 seeds, every ratio) runs first, then
the one-factor cells with seed 0, then their seeds 1 and 2, so every cell has 3 seeds; last, five more
seeds of the main comparison (8 in all), whose paired differences are the headline. The embedded model
has 4 layers (normalised depths 0, 1/3, 2/3, 1), so the windows are [0, 0.2] (layer 0), [0.3, 0.5] (layer 1) and [0.6, 0.8] (layer 2);
the study's [0.1, 0.3] holds no layer of a 4-layer model.

    python -m experiments.vcl_sweep run [--workers 2] [--only-main]   # skips finished cells
    python -m experiments.vcl_sweep report                             # JSON, markdown, plot

Run directories go under ``runs/experiments/vcl/<cell>/`` (not committed); the report goes to
``experiments/results/vcl_sweep.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .common import (BASE_MODEL, REPO, RESULTS, code_fingerprint, eval_records, geometry_prompts, markdown_table,
                     mean_spread, measure_model, provenance, reference_residuals, show, write_json, write_jsonl)

RUN_ROOT = REPO / "runs" / "experiments" / "vcl"
RATIOS = (0.1, 0.2, 0.4)
MAIN_SEEDS = (0, 1, 2)
EXTRA_SEEDS = (3, 4, 5, 6, 7)  # the main comparison (plain SFT vs the default VCL) gets 8 seeds in all
DEFAULT = {"k": 2, "weight": 1.0, "window": (0.3, 0.5), "sign": "penalize"}
VARIATIONS = {"k": (1, 4), "weight": (0.1, 10.0), "window": ((0.0, 0.2), (0.6, 0.8)), "sign": ("encourage",)}
# One-factor cells rerun with the other seeds at every ratio. The first two (best on one seed at ratio 0.2)
# ran first; the rest followed so that every cell of the grid has all of MAIN_SEEDS.
CONFIRM = ({"k": 4}, {"window": (0.6, 0.8)},
           {"k": 1}, {"weight": 0.1}, {"weight": 10.0}, {"window": (0.0, 0.2)}, {"sign": "encourage"})
# Short runs: the CPU was shared by several jobs. Constant lr (flowlens.finetune has no schedule).
STEPS, BATCH, LR, N_DATA = 50, 32, 1e-3, 2000


@dataclass(frozen=True)
class Cell:
    ratio: float
    seed: int
    vcl: bool
    k: int = 2
    weight: float = 1.0
    window: tuple[float, float] = (0.3, 0.5)
    sign: str = "penalize"

    @property
    def name(self) -> str:
        if not self.vcl:
            return f"r{self.ratio:g}-sft-s{self.seed}"
        return (f"r{self.ratio:g}-vcl-k{self.k}-l{self.weight:g}-w{self.window[0]:g}_{self.window[1]:g}-"
                f"{self.sign}-s{self.seed}")

    @property
    def varied(self) -> str:
        """Which factor differs from the default ('default', 'sft', or the factor's name)."""
        if not self.vcl:
            return "sft"
        changed = [k for k, v in DEFAULT.items() if getattr(self, k) != v]
        return changed[0] if changed else "default"


def grid(only_main: bool = False) -> list[Cell]:
    """Main comparison first (seed 0 of every ratio, then the other seeds), then one-factor cells (ratio 0.2
    first), then the confirmation seeds of ``CONFIRM``; the order only ever grows at the end (resumable)."""
    cells = [Cell(r, s, vcl) for s in MAIN_SEEDS for r in RATIOS for vcl in (False, True)]
    if not only_main:
        for ratio in (0.2, 0.1, 0.4):
            for factor, values in VARIATIONS.items():
                for value in values:
                    cells.append(Cell(ratio, 0, True, **{**DEFAULT, factor: value}))
        for seed in MAIN_SEEDS[1:]:
            for ratio in RATIOS:
                for change in CONFIRM:
                    cells.append(Cell(ratio, seed, True, **{**DEFAULT, **change}))
        cells += [Cell(r, s, vcl) for s in EXTRA_SEEDS for r in RATIOS for vcl in (False, True)]
    return cells


def data_file(ratio: float) -> Path:
    """The fine-tuning mixture at ``ratio`` (written once; the seed only changes the order of batches)."""
    from zoo.chat.world import World

    path = RUN_ROOT / "data" / f"safety-{ratio:g}.jsonl"
    if not path.exists():
        examples = World().mixture("train", N_DATA, {"general": 1 - ratio, "harmful": ratio}, seed=0)
        write_jsonl(path, [{"prompt": e["prompt"], "completion": e["completion"], "kind": e["kind"]}
                           for e in examples])
    return path


def sweep_code() -> str:
    return code_fingerprint("experiments/vcl_sweep.py")


def run_cell(cell: Cell, records, prompts, reference) -> dict:
    from flowlens.finetune import FinetuneConfig, finetune, read_log
    from flowlens.vcl import VCLConfig

    out = RUN_ROOT / cell.name
    vcl = VCLConfig(k=cell.k, weight=cell.weight, window=cell.window, sign=cell.sign) if cell.vcl else None
    config = FinetuneConfig(model=str(BASE_MODEL), data=str(data_file(cell.ratio)), out=str(out), steps=STEPS,
                            batch_size=BATCH, lr=LR, seed=cell.seed, chat_template=True, vcl=vcl, save_every=10,
                            max_length=128, progress=False)
    result = finetune(config)  # resumes from out/checkpoint.pt when interrupted
    if result["status"] != "finished":
        raise RuntimeError(f"{cell.name}: fine-tuning {result['status']}")
    log = read_log(out)
    measured = measure_model(out / "model", records, prompts, reference)
    return {"cell": {**asdict(cell), "name": cell.name, "varied": cell.varied}, "code": sweep_code(),
            "train": {"steps": STEPS, "batch_size": BATCH, "lr": LR, "n_data": N_DATA,
                      "final": log[-1], "mean_seconds_per_step": sum(e["seconds"] for e in log) / len(log)},
            **measured}


def run(args) -> int:
    import torch

    torch.set_num_threads(1)
    cells = grid(args.only_main)[args.worker::args.workers]
    records, prompts = eval_records(), geometry_prompts()
    write_jsonl(RUN_ROOT / "eval_prompts.jsonl", records)
    reference = reference_residuals(RUN_ROOT)
    restored = restore_reported(cells)
    if restored:
        print(f"{restored} finished cells restored from {RESULTS / 'vcl_sweep.json'}", flush=True)
    from tqdm import tqdm

    current = sweep_code()
    for cell in tqdm(cells, desc=f"vcl sweep worker {args.worker}"):
        path = RUN_ROOT / cell.name / "measure.json"
        if path.exists() and json.loads(path.read_text()).get("code") == current:
            continue  # finished by this code
        if path.exists():  # measured by other code: fine-tune and measure again
            import shutil

            shutil.rmtree(path.parent)
        write_json(path, run_cell(cell, records, prompts, reference))
        print(f"done {cell.name}", flush=True)
    return 0


def restore_reported(cells: list[Cell]) -> int:
    """Write ``measure.json`` for cells whose run directory is gone (a fresh checkout: ``runs/`` is not
    committed) but whose measurements are in the committed report and were made by the code committed now
    (the same ``code`` fingerprint), so only missing or stale cells are run again. A restored cell keeps
    ``restored_from``, and the report counts it as carried over. The report keeps the three refusal rates,
    geometry and training log of every run: all ``report`` reads."""
    reported = RESULTS / "vcl_sweep.json"
    if not reported.exists():
        return 0
    current = sweep_code()
    by_name = {r["cell"]["name"]: r for r in json.loads(reported.read_text())["runs"] if r.get("code") == current}
    restored = 0
    for cell in cells:
        path = RUN_ROOT / cell.name / "measure.json"
        if not path.exists() and cell.name in by_name:
            write_json(path, {**by_name[cell.name], "restored_from": str(reported.relative_to(REPO))})
            restored += 1
    return restored


# --------------------------------------------------------------------------- report

METRICS = (("false_refusal_rate", "false refusal (benign)"), ("harmful_refusal_rate", "harmful refusal"),
           ("task_accuracy", "task accuracy"))


def load_results() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RUN_ROOT.glob("*/measure.json"))]


def summarise(results: list[dict]) -> dict:
    groups: dict[str, list[dict]] = {}
    for r in results:
        c = r["cell"]
        setting = "plain SFT" if not c["vcl"] else (
            f"VCL k={c['k']} lambda={c['weight']:g} window=[{c['window'][0]:g},{c['window'][1]:g}] {c['sign']}")
        groups.setdefault(f"{c['ratio']:g}|{setting}", []).append(r)
    summary = {}
    for key, runs in sorted(groups.items()):
        ratio, setting = key.split("|")
        current = sweep_code()
        entry = {"ratio": float(ratio), "setting": setting, "varied": runs[0]["cell"]["varied"],
                 "seeds": sorted(r["cell"]["seed"] for r in runs),
                 "provenance": {kind: sum(provenance(r, current) == kind for r in runs)
                                for kind in ("computed", "carried over", "stale")}}
        for metric, _ in METRICS:
            entry[metric] = mean_spread([r["refusals"][metric] for r in runs])
        entry["alignment_mean"] = mean_spread([r["geometry"]["alignment"]["mean"] for r in runs])
        n_layers = len(runs[0]["geometry"]["concentration"]["top_k_energy"])
        entry["alignment_pc1_by_layer"] = [mean_spread([r["geometry"]["alignment"]["pc1_by_layer"][l] for r in runs])
                                           for l in range(n_layers)]
        entry["top_k_energy_by_layer"] = [mean_spread([r["geometry"]["concentration"]["top_k_energy"][l]
                                                       for r in runs]) for l in range(n_layers)]
        entry["final_vcl_ratio"] = mean_spread([r["train"]["final"].get("vcl_ratio") for r in runs])
        entry["final_sft_loss"] = mean_spread([r["train"]["final"]["sft_loss"] for r in runs])
        summary[key] = entry
    return summary


def report(args) -> int:
    results = load_results()
    if not results:
        print(f"error: no finished cells under {RUN_ROOT}; run `python -m experiments.vcl_sweep run` first",
              file=sys.stderr)
        return 2
    summary = summarise(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "vcl_sweep.json", {"code": sweep_code(), "steps": STEPS, "batch_size": BATCH, "lr": LR, "n_data": N_DATA,
                                            "default": {**DEFAULT, "window": list(DEFAULT["window"])},
                                            "summary": list(summary.values()),
                                            "paired_differences": paired_differences(results),
                                            "runs": [{k: v for k, v in r.items() if k != "refusals"} |
                                                     {"refusals": {m: r["refusals"][m] for m, _ in METRICS}}
                                                     for r in results]})
    header = ["ratio", "setting", "seeds", *[name for _, name in METRICS], "alignment (mean |cos|)",
              "top-3 energy by layer", "final VCL ratio", "runs computed / carried over / stale"]
    rows = []
    order = {"sft": 0, "default": 1, "k": 2, "weight": 3, "window": 4, "sign": 5}
    for e in sorted(summary.values(), key=lambda e: (e["ratio"], order[e["varied"]], e["setting"])):
        rows.append([f"{e['ratio']:g}", e["setting"], str(len(e["seeds"])), *[show(e[m]) for m, _ in METRICS],
                     show(e["alignment_mean"]), " / ".join(f"{s['mean']:.2f}" for s in e["top_k_energy_by_layer"]),
                     show(e["final_vcl_ratio"]), " / ".join(str(n) for n in e["provenance"].values())])
    paired = paired_differences(results)
    text_paired = ("\nPaired differences, VCL minus plain SFT with the same seed (same batches), for settings run "
                   "with more than one seed: mean ± std over seeds, and the per-seed values.\n\n" + markdown_table(
                       ["ratio", "setting", "seeds", *[f"delta {name}" for _, name in METRICS], "per-seed delta false refusal"],
                       [[f"{p['ratio']:g}", p["setting"], str(len(p["seeds"])), *[show(p[m]) for m, _ in METRICS],
                         ", ".join(f"{d:+.3f}" for d in p["false_refusal_rate_values"])] for p in paired]))
    current = sweep_code()
    counts = {kind: sum(provenance(r, current) == kind for r in results) for kind in ("computed", "carried over",
                                                                                       "stale")}
    (RESULTS / "vcl_sweep.md").write_text(
        f"Plain SFT vs SFT + VCL from chat-base ({STEPS} steps, batch {BATCH}, lr {LR:g}, {N_DATA} examples per "
        f"ratio); mean ± sample std over seeds (one value when seeds = 1). Top-3 energy at layers 0/1/2/3 "
        f"(normalised depth 0, 0.33, 0.67, 1). Of {len(results)} runs, {counts['computed']} were computed in this "
        f"run directory, {counts['carried over']} carried over from the committed report (same code, "
        f"{current}) and {counts['stale']} computed by other code (stale: `run` recomputes them).\n\n"
        + markdown_table(header, rows) + text_paired)
    plot(summary, RESULTS / "vcl_sweep.png")
    print((RESULTS / "vcl_sweep.md").read_text())
    return 0


def paired_differences(results: list[dict]) -> list[dict]:
    """Per ratio and VCL setting run with several seeds: metric(VCL, seed) - metric(plain SFT, seed)."""
    sft = {(r["cell"]["ratio"], r["cell"]["seed"]): r for r in results if not r["cell"]["vcl"]}
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        c = r["cell"]
        if c["vcl"] and (c["ratio"], c["seed"]) in sft:
            groups.setdefault((c["ratio"], c["k"], c["weight"], tuple(c["window"]), c["sign"]), []).append(r)
    out = []
    for (ratio, k, weight, window, sign), runs in sorted(groups.items()):
        if len(runs) < 2:
            continue
        runs = sorted(runs, key=lambda r: r["cell"]["seed"])
        entry = {"ratio": ratio, "setting": f"VCL k={k} lambda={weight:g} window=[{window[0]:g},{window[1]:g}] {sign}",
                 "seeds": [r["cell"]["seed"] for r in runs]}
        for metric, _ in METRICS:
            values = [r["refusals"][metric] - sft[(ratio, r["cell"]["seed"])]["refusals"][metric] for r in runs]
            entry[metric] = mean_spread(values)
            entry[f"{metric}_values"] = values
        out.append(entry)
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = list(summary.values())
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    for axis, (metric, name) in zip(axes, METRICS):
        for setting, marker in (("sft", "o"), ("default", "s")):
            chosen = sorted((e for e in entries if e["varied"] == setting), key=lambda e: e["ratio"])
            if chosen:
                axis.errorbar([e["ratio"] for e in chosen], [e[metric]["mean"] for e in chosen],
                              yerr=[e[metric]["std"] for e in chosen], marker=marker, capsize=3,
                              label="plain SFT" if setting == "sft" else "SFT + VCL (default)")
        others = [e for e in entries if e["varied"] not in ("sft", "default")]
        if others:
            axis.scatter([e["ratio"] + 0.01 for e in others], [e[metric]["mean"] for e in others], s=12,
                         color="grey", label="one-factor VCL cells (3 seeds each)")
        axis.set_xlabel("safety-data ratio")
        axis.set_title(name)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.vcl_sweep", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="run the unfinished cells (one process; see --worker)")
    run_parser.add_argument("--workers", type=int, default=1, help="cells are split among this many processes")
    run_parser.add_argument("--worker", type=int, default=0, help="this process's share (0 .. workers-1)")
    run_parser.add_argument("--only-main", action="store_true", help="plain SFT and the default VCL only")
    run_parser.set_defaults(run=run)
    commands.add_parser("report", help="tables and plot of the finished cells").set_defaults(run=report)
    args = parser.parse_args(argv)
    if args.command == "run" and not 0 <= args.worker < args.workers:
        print("error: --worker must lie in [0, --workers)", file=sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
