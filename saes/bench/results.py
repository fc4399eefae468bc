"""The SAEBench results of one model's SAEs, as they were written (read, never recomputed): for the UI's Features tab.

- a language model: the `saes bench` files beside each SAE directory, `<SAE>/saebench/<eval>/*_eval_results.json`
  (SAEBench's envelope), and those of SAEs not shipped, under `experiments/results/saebench_lm_*/` (e.g.
  benchmarks/saebench_sweep_smollm2.py's sweep), read with `saes.bench.plots.collect`: one row per SAE whose core
  result names the model;
- an image model: the runs of `python -m experiments.image_saebench`, `experiments/results/image_saebench_*.json`
  whose "model" is the model: one row per SAE and run (the run is the file's name after `image_saebench_`).

Each row holds "model", "sae", "architecture", "d_sae", "l0" and its metrics as "<eval>:<metric>", so
`saes.bench.plots.figure` draws either (SAEBench's metric-vs-L0 plot) with the panels given here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .plots import LATER_EVALS, LM_PANELS, TABLE, collect, group_rows

ROOT = Path(__file__).resolve().parents[2]
IMAGE_RESULTS = ROOT / "experiments" / "results"
IMAGE_PREFIX = "image_saebench_"
LM_SWEEPS = "saebench_lm_*"  # folders of experiments/results with the bench results of SAEs not shipped

IMAGE_HEADLINE = [  # (eval, metric, column title): experiments/image_saebench.py's table and the UI's
    ("image_reconstruction", "explained_variance", "EV"),
    ("image_reconstruction", "l0", "L0"),
    ("image_reconstruction", "denoiser_loss_recovered", "loss rec. (denoiser)"),
    ("image_reconstruction", "latent_loss_recovered", "loss rec. (latent)"),
    ("image_reconstruction", "probe_accuracy_spliced", "probe spliced"),
    ("image_sparse_probing", "sae_top_1_test_accuracy", "probe top-1"),
    ("image_sparse_probing", "sae_top_5_test_accuracy", "probe top-5"),
    ("image_sparse_probing", "raw_update_top_5_test_accuracy", "raw top-5"),
    ("image_localisation", "mean_localisation", "localisation"),
    ("image_localisation", "n_labelled", "labelled"),
    ("image_localisation", "moran_i_unlabelled", "Moran's I (unlab.)"),
    ("image_absorption", "mean_absorption_fraction_score", "absorption"),
    ("image_absorption", "mean_full_absorption_score", "full abs."),
    ("image_unlearning", "unlearning_accuracy", "unlearn"),
    ("image_unlearning", "in_domain_retention", "in-dom."),
    ("image_unlearning", "cross_domain_retention", "cross-dom."),
    ("image_editing", "success_at_preservation", "edit success"),
]
IMAGE_PANELS = (("image_reconstruction:denoiser_loss_recovered", "denoising loss recovered"),
                ("image_reconstruction:explained_variance", "explained variance"),
                ("image_sparse_probing:sae_top_5_test_accuracy", "sparse probing: top-5 latents"),
                ("image_localisation:mean_localisation", "localisation"))


@dataclass
class ModelResults:
    """A model's bench results: rows (one per SAE, or SAE and run), the table's columns (title, row key), the plot's
    panels (row key, title), the files read, and the command that makes more."""
    model: str
    rows: list[dict]
    columns: list[tuple[str, str]]
    panels: tuple
    sources: list[str] = field(default_factory=list)
    command: str = ""

    def table(self, digits: int = 3) -> tuple[list[str], list[list]]:
        """(headers, rows): the SAE, then each column some row has (floats rounded to `digits`; None: no result)."""
        present = [(title, key) for title, key in self.columns if any(r.get(key) is not None for r in self.rows)]
        body = []
        for row in self.rows:
            cells = [row.get(key) for _, key in present]
            body.append([row["sae"], *(round(v, digits) if isinstance(v, float) else v for v in cells)])
        return ["SAE", *(title for title, _ in present)], body


def lm_command(model: str) -> str:
    return (f"python -m saes bench --sae <SAE directory> --model {model} --evals core,sparse_probing "
            f"--out <SAE directory>/saebench")


def image_command(model: str) -> str:
    return f"python -m experiments.image_saebench run --model {model} --out {IMAGE_RESULTS.relative_to(ROOT)}/" \
           f"{IMAGE_PREFIX}<name>.json"


def lm_results(model: str, sae_dirs, sweeps=IMAGE_RESULTS) -> ModelResults:
    """The `saes bench` results beside each of `sae_dirs` (an SAE directory), then those in the `saebench_lm_*`
    folders of `sweeps` (None: none), whose core result is on `model`."""
    rows, sources = [], []
    folders = [Path(directory) / "saebench" for directory in sae_dirs]
    if sweeps is not None:
        folders += sorted(p for p in Path(sweeps).glob(LM_SWEEPS) if p.is_dir())
    for folder in folders:
        if not folder.is_dir():
            continue
        try:
            found = collect([folder])
        except ValueError:  # no core result: no L0 to place it by
            continue
        for row in found:
            if row["model"] == model:
                rows.append(row)
                sources.append(str(folder))
    columns = [(title, key) for title, key, _ in (*TABLE, *LATER_EVALS)]
    return ModelResults(model, group_rows(rows) if rows else rows, columns, LM_PANELS, sources, lm_command(model))


def image_results(model: str, folder=IMAGE_RESULTS) -> ModelResults:
    """The rows of every `experiments.image_saebench` run on `model` in `folder`: one per SAE and run (the shipped
    SAEs' run first)."""
    rows, sources = [], []
    paths = sorted(Path(folder).glob(f"{IMAGE_PREFIX}*.json"), key=lambda p: (p.stem != f"{IMAGE_PREFIX}shipped", p.name))
    for path in paths:  # the shipped SAEs' run first
        data = json.loads(path.read_text())
        if data.get("model") != model:
            continue
        run = path.stem[len(IMAGE_PREFIX):]
        sources.append(str(path))
        for name, entry in data.get("saes", {}).items():
            evals = entry.get("evals", {})
            row = {"model": model, "sae": f"{name} ({run})", "architecture": entry.get("architecture"),
                   "d_sae": entry.get("d_sae"), "run": run, "block": entry.get("block"), "trainer": entry.get("trainer")}
            for eval_name, result in evals.items():
                row.update({f"{eval_name}:{k}": v for k, v in (result.get("metrics") or {}).items()})
            row["l0"] = row.get("image_reconstruction:l0")
            rows.append(row)
    columns = [(title, f"{e}:{m}") for e, m, title in IMAGE_HEADLINE]
    return ModelResults(model, rows, columns, IMAGE_PANELS, sources, image_command(model))


__all__ = ["IMAGE_HEADLINE", "IMAGE_PANELS", "IMAGE_RESULTS", "LM_SWEEPS", "ModelResults", "image_command",
           "image_results", "lm_command", "lm_results"]
