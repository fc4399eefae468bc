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
# which way is better, per headline metric a trainer can win (L0, the count of labels, the raw update's probe and
# Moran's I of unlabelled features describe an SAE without ranking it)
IMAGE_BETTER = {
    ("image_reconstruction", "explained_variance"): 1, ("image_reconstruction", "denoiser_loss_recovered"): 1,
    ("image_reconstruction", "latent_loss_recovered"): 1, ("image_reconstruction", "probe_accuracy_spliced"): 1,
    ("image_sparse_probing", "sae_top_1_test_accuracy"): 1, ("image_sparse_probing", "sae_top_5_test_accuracy"): 1,
    ("image_localisation", "mean_localisation"): 1, ("image_absorption", "mean_absorption_fraction_score"): -1,
    ("image_absorption", "mean_full_absorption_score"): -1, ("image_unlearning", "unlearning_accuracy"): 1,
    ("image_unlearning", "in_domain_retention"): 1, ("image_unlearning", "cross_domain_retention"): 1,
    ("image_editing", "success_at_preservation"): 1}
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
    summaries: list[tuple[str, list[str], list[list]]] = field(default_factory=list)  # (run, trainer_summary)

    def table(self, digits: int = 3) -> tuple[list[str], list[list]]:
        """(headers, rows): the SAE, then each column some row has (floats rounded to `digits`; None: no result)."""
        present = [(title, key) for title, key in self.columns if any(r.get(key) is not None for r in self.rows)]
        body = []
        for row in self.rows:
            cells = [row.get(key) for _, key in present]
            body.append([row["sae"], *(round(v, digits) if isinstance(v, float) else v for v in cells)])
        return ["SAE", *(title for title, _ in present)], body


def item_values(evals: dict, eval_name: str, metric: str) -> dict | None:
    """The per-item values a headline metric averages, by item, read from the eval's details (None: a metric computed
    over many positions or images at once, or one number): sparse probing's attribute-value tasks (the metric is the
    mean of the attributes' means, these are its tasks), localisation's labelled features, absorption's and
    unlearning's concepts, editing's RIEBench categories. Items of the same name are the same task for every SAE of
    a block (but features)."""
    details = (evals.get(eval_name) or {}).get("details") or {}
    if eval_name == "image_sparse_probing" and metric.startswith("sae_top_"):
        return {f"{name}={value}": row[metric] for name, attribute in details.get("attributes", {}).items()
                for value, row in attribute["values"].items() if row.get(metric) is not None}
    if eval_name == "image_localisation" and metric == "mean_localisation":
        return {f"feature {i}": f["inside"] for i, f in details.get("features", {}).items()}
    if eval_name == "image_absorption":
        key = {"mean_absorption_fraction_score": "absorption_fraction", "mean_full_absorption_score": "full_absorption"}
        return {c: row[key[metric]] for c, row in details.get("values", {}).items()} if metric in key else None
    if eval_name == "image_unlearning" and metric in ("unlearning_accuracy", "in_domain_retention",
                                                       "cross_domain_retention"):
        return {c: row["sae"][metric] for c, row in details.get("concepts", {}).items()
                if row["sae"].get(metric) is not None}
    if eval_name == "image_editing" and metric == "success_at_preservation" and details.get("categories"):
        return dict(details["categories"])  # the best configuration's success per RIEBench category
    return None


def _se(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5


def standard_error(evals: dict, eval_name: str, metric: str) -> float | None:
    """The standard error of a headline metric's mean over its items (`item_values`): the sampling noise of the items
    the bench drew. None where the metric has no items (or fewer than two)."""
    items = item_values(evals, eval_name, metric)
    return None if items is None else _se(list(items.values()))


def difference_error(a: list[dict], b: list[dict], eval_name: str, metric: str) -> float | None:
    """The standard error of the difference of two SAE sets' means over blocks (`a[i]`, `b[i]`: block i's evals):
    per block, paired over the items both have (the same tasks or concepts), else unpaired; None where a block's
    metric has no items."""
    variances = []
    for evals_a, evals_b in zip(a, b):
        items_a, items_b = item_values(evals_a, eval_name, metric), item_values(evals_b, eval_name, metric)
        if items_a is None or items_b is None:
            return None
        if items_a.keys() == items_b.keys() and eval_name != "image_localisation":
            se = _se([items_a[k] - items_b[k] for k in items_a])
        else:
            se_a, se_b = _se(list(items_a.values())), _se(list(items_b.values()))
            se = None if se_a is None or se_b is None else (se_a ** 2 + se_b ** 2) ** 0.5
        if se is None:
            return None
        variances.append(se * se)
    return sum(variances) ** 0.5 / len(variances) if variances else None


SHIPPED_TRAINER = "topk-shipped"  # experiments.image_saebench's name for the shipped TopK SAEs: a reference trained
# on another budget and store, shown beside a like-for-like set but not ranked with it


def trainer_summary(data: dict, exclude=(SHIPPED_TRAINER,)) -> tuple[list[str], list[list]]:
    """Which trainer wins each metric, from one `experiments.image_saebench` run holding several trainers: per metric
    of IMAGE_BETTER, the trainer best on its mean over the blocks every trainer has, its mean, the runner-up, the
    margin, twice the margin's standard error (`difference_error`: "-" where the metric has no items), how many of
    those blocks the winner is best on (ties count), and the reading: "tie" where the margin is within its noise
    or rounds to 0.000, else "wins" ("wins (no noise estimate)" where the metric has no items)."""
    saes = data.get("saes", {})
    trainers = [t for t in dict.fromkeys(entry["trainer"] for entry in saes.values()) if t not in exclude]
    headers = ["metric", "winner", "mean", "runner-up", "margin", "noise (2 SE)", "blocks won", "reading"]
    if len(trainers) < 2:
        return headers, []
    blocks = sorted(set.intersection(*({e["block"] for e in saes.values() if e["trainer"] == t} for t in trainers)))
    by = {(e["trainer"], e["block"]): e["evals"] for e in saes.values()}
    titles = {(e, m): t for e, m, t in IMAGE_HEADLINE}
    rows = []
    for (eval_name, metric), sign in IMAGE_BETTER.items():
        means = {}
        for trainer in trainers:
            values = [(by[trainer, b].get(eval_name) or {}).get("metrics", {}).get(metric) for b in blocks]
            if blocks and all(v is not None for v in values):
                means[trainer] = sum(values) / len(values)
        if len(means) < 2:
            continue
        first, second = sorted(means, key=lambda t: -sign * means[t])[:2]
        margin = abs(means[first] - means[second])
        se = difference_error([by[first, b] for b in blocks], [by[second, b] for b in blocks], eval_name, metric)
        noise = None if se is None else 2 * se
        won = sum(1 for b in blocks if all(sign * by[first, b][eval_name]["metrics"][metric]
                                           >= sign * by[t, b][eval_name]["metrics"][metric] for t in means))
        tie = round(margin, 3) == 0 or (noise is not None and margin <= noise)
        reading = "tie" if tie else "wins" if noise is not None else "wins (no noise estimate)"
        rows.append([titles.get((eval_name, metric), metric), first, round(means[first], 3), second, round(margin, 3),
                     "-" if noise is None else round(noise, 3), f"{won}/{len(blocks)}", reading])
    return headers, rows


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub table of (headers, rows)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


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
    SAEs' run first), and each run of several trainers' `trainer_summary`."""
    rows, sources, summaries = [], [], []
    paths = sorted(Path(folder).glob(f"{IMAGE_PREFIX}*.json"), key=lambda p: (p.stem != f"{IMAGE_PREFIX}shipped", p.name))
    for path in paths:  # the shipped SAEs' run first
        data = json.loads(path.read_text())
        if data.get("model") != model:
            continue
        run = path.stem[len(IMAGE_PREFIX):]
        sources.append(str(path))
        headers, summary = trainer_summary(data)
        if summary:  # a run of several trainers: which wins each metric
            summaries.append((run, headers, summary))
        for name, entry in data.get("saes", {}).items():
            evals = entry.get("evals", {})
            row = {"model": model, "sae": f"{name} ({run})", "architecture": entry.get("architecture"),
                   "d_sae": entry.get("d_sae"), "run": run, "block": entry.get("block"), "trainer": entry.get("trainer")}
            for eval_name, result in evals.items():
                row.update({f"{eval_name}:{k}": v for k, v in (result.get("metrics") or {}).items()})
            row["l0"] = row.get("image_reconstruction:l0")
            rows.append(row)
    columns = [(title, f"{e}:{m}") for e, m, title in IMAGE_HEADLINE]
    return ModelResults(model, rows, columns, IMAGE_PANELS, sources, image_command(model), summaries)


__all__ = ["IMAGE_BETTER", "IMAGE_HEADLINE", "IMAGE_PANELS", "IMAGE_RESULTS", "LM_SWEEPS", "SHIPPED_TRAINER",
           "ModelResults", "difference_error", "image_command", "image_results", "item_values", "lm_command",
           "lm_results", "markdown_table", "standard_error", "trainer_summary"]
