"""``python -m flowlens analyze``: residual geometry of a model (and a reference) on a prompt file.

Residuals at the last prompt token of every layer (``blocks.{l}.hook_resid_post``, through
``interp``), then: stacked and concatenated PCA with per-layer projections against normalised
depth, concentration statistics per layer, PC1 stability without trailing punctuation, and the
structural alignment with a reference model. Writes ``analysis.json``, ``geometry.png`` and
``geometry.html`` (interactive, plotly) in the output directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from interp.atomic import atomic_write_text
from interp.cli import (LM_DTYPE, add_backend_argument, add_device_argument, add_dtype_argument, add_out_argument,
                        parse_dtype)

from .diversity import DataError, PROMPT_FIELDS, read_jsonl
from .geometry import concentration_by_layer, layer_projections, pc1_stability, structural_alignment
from .refusals import MODEL_HELP, add_chat_template_argument


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from JSONL (a prompt/query/instruction field), XSTest CSV, or a text file (one a line)."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        from .refusals import read_xstest_csv

        return [r.prompt for r in read_xstest_csv(path)]
    if path.suffix.lower() == ".jsonl":
        prompts = []
        for number, record in read_jsonl(path):
            text = next((record[f] for f in PROMPT_FIELDS if isinstance(record.get(f), str)), None)
            if text is None:
                raise DataError(f"{path}: line {number} has no prompt field (one of {', '.join(PROMPT_FIELDS)})")
            prompts.append(text)
        return prompts
    if not path.is_file():
        raise FileNotFoundError(f"no such prompt file: {path}")
    from interp.lm_text import read_text_file

    prompts = [line.strip() for line in read_text_file(path).splitlines() if line.strip()]
    if not prompts:
        raise DataError(f"{path}: no prompts (the file is empty)")
    return prompts


def check_prompt_set(prompts: list[str], where: str = "the prompt set", minimum: int = 3) -> list[str]:
    """The prompts, refused when PCA of their residuals would measure nothing: an empty prompt (named by its
    position), or fewer than ``minimum`` distinct prompts (identical prompts give identical residuals, whose
    "principal components" are numerical noise)."""
    empty = [i + 1 for i, prompt in enumerate(prompts) if not prompt.strip()]
    if empty:
        raise DataError(f"{where}: prompt {empty[0]} is empty ({len(empty)} of {len(prompts)} are); give text to "
                        "analyse or remove it")
    distinct = len(set(prompts))
    if distinct < minimum:
        raise DataError(f"{where}: PCA of residuals needs at least {minimum} different prompts, got {distinct}"
                        + (f" (of {len(prompts)}: identical prompts give identical residuals)"
                           if distinct < len(prompts) else ""))
    return prompts


def residuals_of(lm, prompts: list[str], chat_template: bool | None, strip: bool):
    """``(N, L, d)`` resid_post at the last prompt token of a loaded ``interp`` language model."""
    from interp.hooks.lm import last_token_residuals

    return last_token_residuals(lm, prompts, chat_template=chat_template, strip_trailing_punctuation=strip,
                                progress=True).numpy()


def checked_components(k: int | str, n_prompts: int) -> int | str:
    """The number of principal components to fit, or "twonn" (chosen from the data): a whole number from 1 to the
    number of prompts, since N prompts' residuals span at most N directions per layer (more components would be
    fitted to nothing and reported as if they meant something)."""
    if k == "twonn":
        return k
    try:
        number = float(k)
    except (TypeError, ValueError):
        raise DataError(f"the number of principal components must be a whole number or 'twonn', not {k!r}") from None
    if not number.is_integer() or not 1 <= number <= n_prompts:
        raise DataError(f"{k} principal components from {n_prompts} prompts: ask for 1 to {n_prompts} "
                        f"(N prompts' residuals have at most N components), or give more prompts")
    return int(number)


def analyse(residuals: np.ndarray, reference: np.ndarray | None, stripped: np.ndarray | None, k: int | str) -> dict:
    """All FlowLens statistics of ``(N, L, d)`` residuals, as JSON-ready lists."""
    k = checked_components(k, residuals.shape[0])
    result: dict = {"n_prompts": residuals.shape[0], "n_layers": residuals.shape[1], "width": residuals.shape[2]}
    for construction in ("stacked", "concatenated"):
        fit = layer_projections(residuals, construction, k)
        result[construction] = {"n_components": fit.pca.n_components, "method": fit.pca.method,
                                "explained_variance_ratio": fit.pca.explained_variance_ratio.tolist(),
                                "mean_projection_by_layer": fit.mean_by_layer().tolist(),
                                "depth": fit.depth.tolist()}
    n_components = result["stacked"]["n_components"]
    result["concentration"] = concentration_by_layer(residuals, n_components)
    if stripped is not None:
        stability = pc1_stability(residuals, stripped)
        result["pc1_stability"] = {"per_layer": stability["per_layer"].tolist(), "overall": stability["overall"]}
    if reference is not None:
        alignment = structural_alignment(residuals, reference, n_components)
        result["alignment"] = {"score": alignment["score"].tolist(), "depth": alignment["depth"].tolist(),
                               "reference_layer": alignment["reference_layer"].tolist()}
    return result


def geometry_figures(results: dict[str, dict]) -> dict[str, object]:
    """Interactive (plotly) figures of one or more models' ``analyse`` results, keyed by model name.

    ``"concentration"``: top-k energy and effective rank per layer against normalised depth;
    ``"projections"``: the mean coordinate on each stacked PC along depth; ``"alignment"``
    (when a result has one): |cos| of each PC with the reference model's, per layer.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    concentration = make_subplots(rows=1, cols=2, subplot_titles=("top-k energy (variance concentration)",
                                                                  "effective rank"))
    projections = go.Figure()
    alignment = go.Figure()
    for name, result in results.items():
        c = result["concentration"]
        concentration.add_trace(go.Scatter(x=c["depth"], y=c["top_k_energy"], mode="lines+markers",
                                           name=f"{name}: top-{c['k']} energy"), row=1, col=1)
        concentration.add_trace(go.Scatter(x=c["depth"], y=c["effective_rank"], mode="lines+markers",
                                           name=f"{name}: effective rank"), row=1, col=2)
        depth = result["stacked"]["depth"]
        trajectory = np.array(result["stacked"]["mean_projection_by_layer"])
        for j in range(trajectory.shape[1]):
            projections.add_trace(go.Scatter(x=depth, y=trajectory[:, j].tolist(), mode="lines+markers",
                                             name=f"{name}: PC{j + 1}"))
        if "alignment" in result:
            score = np.array(result["alignment"]["score"])
            for j in range(score.shape[1]):
                alignment.add_trace(go.Scatter(x=result["alignment"]["depth"], y=score[:, j].tolist(),
                                               mode="lines+markers", name=f"{name}: PC{j + 1}"))
    concentration.update_xaxes(title_text="normalised depth l/(L-1)")
    concentration.update_layout(title="Variance concentration per layer", height=380)
    projections.update_layout(title="Mean projection on the stacked principal components along depth",
                              xaxis_title="normalised depth l/(L-1)", yaxis_title="mean coordinate", height=380)
    figures = {"concentration": concentration, "projections": projections}
    if alignment.data:
        alignment.update_layout(title="Structural alignment with the reference (|cos| of matched PCs)",
                                xaxis_title="normalised depth l/(L-1)", yaxis_title="|cos|",
                                yaxis_range=[0, 1.02], height=380)
        figures["alignment"] = alignment
    return figures


def plot(result: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    depth = result["stacked"]["depth"]
    trajectory = np.array(result["stacked"]["mean_projection_by_layer"])
    panels = [("mean projection on stacked PCs", {f"PC{j + 1}": trajectory[:, j] for j in range(trajectory.shape[1])}),
              ("variance concentration", {f"top-{result['concentration']['k']} energy":
                                          result["concentration"]["top_k_energy"]}),
              ("effective rank / participation", {"effective rank": result["concentration"]["effective_rank"],
                                                  "participation ratio":
                                                  result["concentration"]["participation_ratio"]})]
    if "alignment" in result:
        score = np.array(result["alignment"]["score"])
        panels.append(("alignment with reference |cos|", {f"PC{j + 1}": score[:, j] for j in range(score.shape[1])}))
    marker = {"marker": "o", "markersize": 6 if len(depth) <= 12 else 3}  # 30 layers read better with small dots
    figure, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6))
    interactive = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels])
    for column, (axis, (name, series)) in enumerate(zip(np.atleast_1d(axes), panels), start=1):
        for label, values in series.items():
            axis.plot(depth, values, label=label, **marker)
            interactive.add_trace(go.Scatter(x=depth, y=list(values), mode="lines+markers", name=f"{name}: {label}"),
                                  row=1, col=column)
        axis.set_title(name, fontsize=10)
        axis.set_xlabel(f"normalised depth l/(L-1), {len(depth)} layers")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(out / "geometry.png", dpi=120)
    plt.close(figure)
    interactive.update_layout(title=title, height=450)
    interactive.write_html(out / "geometry.html", include_plotlyjs=True)


def analyze_command(args) -> int:
    prompts = check_prompt_set(read_prompts(args.prompts), str(args.prompts))
    k = checked_components(args.components, len(prompts))  # before any model is loaded
    from interp.models.lm import load_lm

    dtype = parse_dtype(args.dtype, default=LM_DTYPE)
    lm = load_lm(args.model, backend=args.backend, device=args.device, dtype=dtype)
    residuals = residuals_of(lm, prompts, args.chat_template, False)
    stripped = residuals_of(lm, prompts, args.chat_template, True) if args.stability else None
    reference = residuals_of(load_lm(args.reference, backend=args.backend, device=args.device, dtype=dtype), prompts,
                             args.chat_template, False) if args.reference else None
    result = {"model": args.model, "reference": args.reference, "prompts": str(args.prompts),
              "model_dtype": args.dtype,
              **analyse(residuals, reference, stripped, k)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "analysis.json", json.dumps(result, indent=2) + "\n")
    plot(result, out, f"{args.model} ({len(prompts)} prompts)")
    concentration = result["concentration"]
    print(f"{result['n_layers']} layers, width {result['width']}, {result['n_prompts']} prompts; "
          f"stacked PCA: {result['stacked']['n_components']} components")
    print("depth  top-k energy  eff. rank" + ("  alignment(PC1)" if "alignment" in result else ""))
    for layer, depth in enumerate(concentration["depth"]):
        line = f"{depth:5.2f}  {concentration['top_k_energy'][layer]:12.3f}  {concentration['effective_rank'][layer]:9.2f}"
        if "alignment" in result:
            line += f"  {result['alignment']['score'][layer][0]:14.3f}"
        print(line)
    print(f"wrote {out / 'analysis.json'}, geometry.png, geometry.html")
    return 0


def add_analyze_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--reference", default=None, help="reference model for the structural alignment score")
    parser.add_argument("--prompts", required=True, help="JSONL (prompt field), XSTest CSV, or text (one a line)")
    add_out_argument(parser, required=True)
    parser.add_argument("--components", default="3", help="number of principal components, or 'twonn'")
    add_chat_template_argument(parser)
    parser.add_argument("--no-stability", dest="stability", action="store_false",
                        help="skip the PC1 stability check (without trailing punctuation)")
    add_backend_argument(parser)
    add_device_argument(parser)
    add_dtype_argument(parser, what="the models")
