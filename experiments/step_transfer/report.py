"""The step-transfer study's report: the figures collected from the study's run directory (`collect_results`), the
tables and the page (`markdown`: experiments/results/<stem>.md is `markdown` of the JSON beside it), and `report`
(both files, and with --docs the tables of docs/experiments/step-transfer.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .causal import CAUSAL_BLOCKS, CAUSAL_K_TRANS, PAINT_ATTRIBUTES, causal_results, paint_results
from .measure import _measured_with, position_vectors, update_drift
from .study import DEFAULT_MODEL, REFERENCE, REPO, Study, _scheduler_note, _shown, base_column

def collect_results(study: Study, base: str | None = None) -> dict:
    study = study.with_base(base)
    cfg = None
    data = {"model": study.model, "sae_root": str(study.sae_root.relative_to(REPO)), "reference": REFERENCE,
            "settings": {n: asdict(s) for n, s in study.settings.items()}, "quality": {}, "blocks": {}}
    for name, setting in study.settings.items():
        path = study.run_root / "eval" / f"{setting.slug}.json"
        if not path.exists():
            raise FileNotFoundError(f"{_shown(path)} is missing: run "
                                    f"`python -m experiments.step_transfer run{study.model_flag()}`")
        data["quality"][name] = json.loads(path.read_text())["quality"]
    for path in sorted(study.sae_dir("measured").glob("*.json")):
        measured = json.loads(path.read_text())
        cfg = cfg or measured["config"]
        if (_measured_with(measured["config"]) != _measured_with(cfg)
                or list(measured["settings"]) != list(study.settings)):
            raise ValueError(f"{_shown(path)} was measured with other settings than the other blocks: run "
                             "`python -m experiments.step_transfer run` to the end (it recomputes it)")
        data["blocks"][measured["block"]] = measured["settings"]
    if not data["blocks"]:
        raise FileNotFoundError(f"{_shown(study.sae_dir('measured'))}/ is empty: run "
                                f"`python -m experiments.step_transfer run{study.model_flag()}`")
    data["config"] = cfg
    data["scheduler"] = _scheduler_note(study.model)
    if base:
        data["base"] = {"model": base, "column": base_column(base, study.model), "scheduler": _scheduler_note(base)}
    data["update_drift"] = _drifts(study, data["blocks"])
    cost_path = study.run_root / "base_step_cost.json"
    data["base_step_cost"] = json.loads(cost_path.read_text()) if cost_path.exists() else None
    data["causal"] = causal_results(study, base)
    data["paint"] = paint_results(study, base)
    return data


def _drifts(study: Study, blocks) -> dict:
    """{block: {setting: [drift of each step's updates from the 1-step run's]}} from the captured updates."""
    from safetensors.torch import load_file

    updates = {name: load_file(str(study.run_root / "eval" / f"{setting.slug}.safetensors"))
               for name, setting in study.settings.items()}
    out = {}
    for block in blocks:
        reference = position_vectors(updates[REFERENCE][block][:, 0])
        out[block] = {name: [update_drift(reference, position_vectors(u[block][:, s]))
                             for s in range(u[block].shape[1])]
                      for name, u in updates.items()}
    return out



def _f(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _on_toy(data: dict, name: str) -> bool:
    """Whether a setting generates with the one-step model itself (not with the base model of `--base`)."""
    return data["settings"][name]["model"] == data["model"]


def _compared_steps(entry: dict, key: str, skip_first: bool = True) -> float | None:
    """The mean of an agreement figure over the compared steps: on the one-step model, the steps after the first
    (the first is the 1-step call itself); on the base model, every step (its first call is its own weights' on the
    same noise)."""
    values = [a[key] for a in entry["agreement_per_step"][1 if skip_first else 0:] if a[key] is not None]
    return float(np.mean(values)) if values else None


MAX_STEPS_SHOWN = 8


def _shown_steps(n: int) -> list[int]:
    """The steps (0-based) a per-step cell shows: all of a short setting's, eight spread evenly over a long one's."""
    if n <= MAX_STEPS_SHOWN:
        return list(range(n))
    return sorted({round(i) for i in np.linspace(0, n - 1, MAX_STEPS_SHOWN)})


def reconstruction_table(data: dict) -> str:
    lines = ["| block | setting | EV shipped | EV ceiling | EV random | L0 shipped | dead shipped | dead ceiling |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for block, settings in data["blocks"].items():
        for name, entry in settings.items():
            s, c, r = (entry[k]["all_steps"] for k in ("shipped", "ceiling", "random"))
            lines.append(f"| {block} | {name} | {_f(s['explained_variance'])} | {_f(c['explained_variance'])} | "
                         f"{_f(r['explained_variance'])} | {s['l0']:.2f} | {s['dead_fraction']:.2f} | "
                         f"{c['dead_fraction']:.2f} |")
    return "\n".join(lines) + "\n"


def per_step_table(data: dict) -> str:
    """EV of the shipped SAE and of the ceiling at each step of each multi-step setting."""
    lines = ["| block | setting | update drift from 1 step, by step | EV shipped by step | EV ceiling by step |",
             "|---|---|---|---|---|"]
    for block, settings in data["blocks"].items():
        for name, entry in settings.items():
            n = len(entry["shipped"]["per_step"])
            if n == 1:
                continue
            shown = _shown_steps(n)
            label = name if len(shown) == n else f"{name} (steps {', '.join(str(i + 1) for i in shown)})"
            drift = data["update_drift"][block][name]
            ev = [" / ".join(_f(entry[kind]["per_step"][i]["explained_variance"], 2) for i in shown)
                  for kind in ("shipped", "ceiling")]
            lines.append(f"| {block} | {label} | " + " / ".join(_f(drift[i], 3) for i in shown) + " | "
                         + " | ".join(ev) + " |")
    return "\n".join(lines) + "\n"


def agreement_table(data: dict) -> str:
    lines = ["| block | setting | correlation (last step) | shipped: correlation, compared steps | random | "
             "top-k overlap, compared steps | random | active-set Jaccard, compared steps | random | features |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for block, settings in data["blocks"].items():
        for name, entry in settings.items():
            if name == REFERENCE:
                continue
            s, r = entry["shipped"], entry["random"]
            skip = _on_toy(data, name)
            cells = [_f(_compared_steps(e, key, skip)) for key in ("correlation", "top_k_overlap", "active_jaccard")
                     for e in (s, r)]
            lines.append(f"| {block} | {name} | {_f(s['agreement_per_step'][-1]['correlation'])} | "
                         + " | ".join(cells) + f" | {s['agreement_per_step'][0]['features_compared']} |")
    return "\n".join(lines) + "\n"


def quality_table(data: dict) -> str:
    columns = ("background", "shape", "colour", "size", "texture", "position", "all")
    lines = ["| setting | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, quality in data["quality"].items():
        lines.append(f"| {name} | " + " | ".join(f"{quality[c]:.2f}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _steps_name(steps: str) -> str:
    """A column of the causal tables: a step count of the one-step model ("2 steps"), or the base model's name."""
    return f"{steps} step{'s' if steps != '1' else ''}" if steps.isdigit() else steps


def paint_summary_table(data: dict) -> str:
    """Per strength and step count, over the painted features: the mean share of scenes where the probe reads the
    label (after and before the edit), how many features read it on at least a quarter of the scenes, and the mean
    preservation."""
    paint = data["paint"]
    lines = ["| strength | steps | features | label read after | before | features reading it on >= 0.25 | "
             "preservation |", "|---:|---|---:|---:|---:|---:|---:|"]
    for strength in (f"{s:g}" for s in paint["config"]["strengths"]):
        for steps, by_strength in paint["scores"].items():
            entries = [e for by_feature in by_strength[strength].values() for e in by_feature.values()]
            lines.append(f"| {strength} | {_steps_name(steps)} | {len(entries)} | "
                         f"{np.mean([e['causal_label'] for e in entries]):.3f} | "
                         f"{np.mean([e['causal_label_before'] for e in entries]):.3f} | "
                         f"{sum(e['causal_label'] >= 0.25 for e in entries)} | "
                         f"{np.mean([e['preservation'] for e in entries]):.3f} |")
    return "\n".join(lines) + "\n"


def paint_table(data: dict) -> str:
    """Per painted feature: its card's 1-step score, then at each strength and step count the share of scenes that
    read the label after the edit and the preservation."""
    paint = data["paint"]
    strengths = [f"{s:g}" for s in paint["config"]["strengths"]]
    steps = list(paint["scores"])
    header = " | ".join(f"s {st}, {_steps_name(s)}" for st in strengths for s in steps)
    lines = [f"| block | label | feature | card (1 step) | {header} |",
             "|---|---|---:|---:|" + "---:|" * (len(strengths) * len(steps))]
    for e in paint["features"]:
        cells = [paint["scores"][s][st][e["block"]][str(e["feature"])] for st in strengths for s in steps]
        card = e["card_causal_label"]
        lines.append(f"| {e['block']} | {e['label']} | #{e['feature']} | {_f(card, 2)} | " + " | ".join(
            f"{c['causal_label']:.2f} / {c['preservation']:.2f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"



def causal_table(data: dict) -> str:
    causal = data["causal"]
    steps = list(causal)
    lines = ["| category | edit | " + " | ".join(f"{_steps_name(s)}: success / preservation" for s in steps) + " |",
             "|---|---|" + "---:|" * len(steps)]
    for label in [k for k in causal[steps[0]] if k != "failed"]:
        for category in causal[steps[0]][label]:
            cells = [causal[s][label][category] for s in steps]
            lines.append(f"| {category} | {label} | " + " | ".join(
                f"{c['success']:.2f} / {c['preservation']:.2f} (n {c['n']})" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def cost_line(data: dict) -> str:
    cost = data.get("base_step_cost")
    if not cost:
        return ""
    return (f"\nOne UNet-stage step of the toy-base recipe (`--objective v_prediction`, batch {cost['batch']}, text "
            f"encoders and UNet forward and backward): {cost['step_s']:.2f} s, median of {cost['steps_timed']}, "
            f"{cost['threads']} thread(s), load average {cost['load_average_1min']:.1f} on {cost['cpu_count']} cores "
            "(`python -m experiments.step_transfer cost`).\n")


def _on_base(columns) -> str:
    """The causal paragraphs' note on the base model's column (a results dict's keys), when it has one."""
    base = [c for c in columns if not c.isdigit()]
    return (f", and on the multi-step base model ({base[0]}), which generates with its own weights, steps and "
            "guidance; the edits act on both halves of its guidance batch") if base else ""


def _scheduler_text(note: dict) -> str:
    return (f"{note['_class_name']} ({note['timestep_spacing']} timesteps, prediction {note['prediction_type']}, "
            f"zero terminal SNR {note['rescale_betas_zero_snr']})")


def markdown(data: dict) -> str:
    cfg = data["config"]
    base = data.get("base")
    on_base = "" if not base else f", and on the multi-step base model `{base['model']}` ({base['column']})"
    return (f"## Step transfer: the shipped 1-step SAEs of `{data['model']}` at 1, 2 and 4 steps{on_base}\n\n"
            f"Scheduler: {_scheduler_text(data['scheduler'])}"
            + ("" if not base else f"; the base model's: {_scheduler_text(base['scheduler'])}")
            + f"; one U-Net call per step. {cfg['n_eval']} held-out "
            f"captions, one seed each. Ceiling: TopK SAE of the shipped size trained {cfg['ceiling_steps']} steps of "
            f"{cfg['ceiling_batch']} vectors on that setting's updates of {cfg['n_train']} other captions. Floor: "
            f"random unit directions, encoder = decoder transposed, the shipped k and centre.\n\n"
            "Image quality of each setting (the world's probe on the held-out generations):\n\n" + quality_table(data)
            + "\nReconstruction over every step of the setting (EV: explained variance; dead: share of features that "
            "never fire on these vectors):\n\n" + reconstruction_table(data)
            + "\nAt each denoising step (first / second / ...): how far the block's updates moved from the 1-step "
            "run's on the same caption, seed and position (squared distance over the 1-step updates' variance: 0 the "
            f"same, about 2 unrelated), and the explained variance"
            + ("" if not base else f" (of a setting of more than {MAX_STEPS_SHOWN} steps, {MAX_STEPS_SHOWN} steps "
                                   "spread evenly, named in its row)")
            + ":\n\n" + per_step_table(data)
            + f"\nFeature agreement with the 1-step run (same caption, seed and position). The first step of every "
            f"setting of the one-step model is the 1-step call itself (agreement 1), so its columns average the "
            f"steps after it"
            + ("" if not base else "; the base model's first call is its own weights' on the same noise, so its "
                                   "columns average every step")
            + f"; features: those firing on >= {cfg['min_firing']} positions of the 1-step run; top-k: k = "
            f"{cfg['top_k']} positions:\n\n" + agreement_table(data)
            + ("" if not data.get("causal") else
               f"\nRIEBench's shapes suite with the shipped 1-step SAEs (method sae, static, k_trans {CAUSAL_K_TRANS}, "
               f"through {', '.join(CAUSAL_BLOCKS)}), the same tasks generated and edited at 1, 2 and 4 steps"
               + _on_base(data["causal"]) + " (`python -m experiments.step_transfer causal`):\n\n"
               + causal_table(data))
            + ("" if not data.get("paint") else
               f"\nPainted labels with the shipped 1-step SAEs (`saes causal`'s measurement, "
               f"`saes.causal.causal_label_scores`): per block of the RIEBench edits and label of "
               f"{', '.join(PAINT_ATTRIBUTES)}, the label search's first feature, painted at every step into the "
               f"target object of {data['paint']['config']['scenes']} held-out scenes (seed "
               f"{data['paint']['config']['seed']}; not the scenes of the cards' 1-step scores, seed 21, which chose "
               f"the features) at strength s x its mean activation; the same scenes and seeds generated and edited "
               f"at 1, 2 and 4 steps{_on_base(data['paint']['scores'])} (`python -m experiments.step_transfer "
               f"paint`). Label read: share of scenes "
               f"where the world's probe reads the label on the edited object (before: on the unedited image); "
               f"preservation: share of what the edit should not touch (background, other objects, the object's "
               f"other attributes, no new object) read as on the unedited image:\n\n" + paint_summary_table(data)
               + "\nPer feature (card: its stored 1-step score, seed 21, strength 3; each cell: label read / "
                 "preservation):\n\n" + paint_table(data))
            + cost_line(data) + made_by(data))


def made_by(data: dict) -> str:
    """The report's last line: the commands, with the flags that name the SAEs under test and the base model."""
    flags = " ".join(([f"--model {data['model']}"] if data["model"] != DEFAULT_MODEL else [])
                     + ([f"--base {data['base']['model']}"] if data.get("base") else []))
    commands = "run`, `causal`, `paint` and `cost`" if data.get("base_step_cost") else "run`, `causal` and `paint`"
    each = "" if not flags else f", each{' but `cost`' if data.get('base_step_cost') else ''} with `{flags}`"
    return f"\nMade by `python -m experiments.step_transfer {commands} (then `report`){each}.\n"


DOCS_PAGE = Path("docs") / "experiments" / "step-transfer.md"


def report(study: Study, args) -> int:
    from interp.atomic import atomic_write_text
    from saes.strict_json import dumps

    data = collect_results(study, args.base)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    stem = study.results_stem()
    atomic_write_text(results / f"{stem}.json", dumps(data, indent=2) + "\n")
    atomic_write_text(results / f"{stem}.md", markdown(data))
    print(f"wrote {results / stem}.json and {results / stem}.md")
    if args.docs:  # the tables of the docs page, between its markers (the prose around them is written by hand)
        from experiments.docs_page import refill

        refill(REPO / DOCS_PAGE, study.docs_markers(), markdown(data))
        print(f"refilled {DOCS_PAGE}")
    return 0


__all__ = ["DOCS_PAGE", "agreement_table", "causal_table", "collect_results", "cost_line", "made_by", "markdown",
           "paint_summary_table", "paint_table", "per_step_table", "quality_table", "reconstruction_table", "report"]
