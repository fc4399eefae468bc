"""Issue 19: which SAE features carry refusals in SmolLM2 fine-tuned with safety data, and what ablating them does.

    python -m experiments.smollm2_refusal_features [--cell r0.4-sft-s0] [--top 1 5 20]

The model is a cell of the SmolLM2 study (default: LoRA SFT at safety ratio 0.4, seed 0; its committed
cell JSON says which XSTest prompts it refused, and the fine-tune is redone from its checkpoint, or from
scratch, by ``smollm2_study.train_cell``). The SAE is the shipped one of the base model's layer 15
(``saes/pretrained/smollm2``); LoRA changed layers 10-29, so its fit on the fine-tuned model's residuals is
measured and reported (explained variance at the last prompt token).

1. Residuals at the last prompt token (chat template) of all 450 XSTest prompts at the SAE's hook, encoded.
2. The prompts are split in two halves (even and odd positions of XSTest's file, so every prompt type is in
   both): features are chosen on the even half and the effect of ablating them is read on the odd half too,
   where the choice cannot have fitted the prompts. Two rankings by the difference of mean activation
   between the prompts the model refused and those it answered (XSTest's string-match detector on the cell's
   greedy completions): over all prompts (the issue's), and over the safe prompts only (the false refusals'
   own features).
3. Generation with the top N features ablated (x - a_f d_f at every position, prompt and generated), for
   each N and ranking, and with N features drawn at random among those that fire on the prompts (a control):
   XSTest false-refusal and harmful-refusal rates on all prompts and on the held-out half, next to the same
   generation with no edit and with the refusal direction itself ablated (the difference of mean residuals
   between refused and answered prompts, selection half, projected out at the SAE's layer, and at every
   layer as Arditi et al. do): how much of the refusal a linear read-out at this layer carries at all.

Writes ``experiments/results/smollm2_refusal_features.{json,md,html}`` (the html: the top features' cards).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .common import REPO, RESULTS, markdown_table, write_json

SAE_DIR = REPO / "saes" / "pretrained" / "smollm2" / "blocks.15.hook_resid_post"
N_CARDS = 10


def cell_settings(name: str) -> tuple[float, int]:
    """(ratio, seed) of a fine-tuned study cell named like r0.4-sft-s0."""
    ratio, method, seed = name.split("-")[:3]
    if method != "sft" or not ratio.startswith("r") or not seed.startswith("s"):
        raise ValueError(f"{name!r} is not a plain-SFT cell of the study (r<ratio>-sft-s<seed>)")
    return float(ratio[1:]), int(seed[1:])


def sae_fit(sae, x) -> dict:
    """How well the SAE reconstructs residuals x (N, d): explained variance around their mean, relative error
    |x - x_hat|^2 / |x|^2 and mean cosine. At one position of one template (the last prompt token) the
    prompts' spread is small beside the shared component, so the explained variance can be low, even
    negative, while the relative error stays small: the three together say how far off the SAE is."""
    import torch

    x = torch.as_tensor(x).float()
    with torch.no_grad():
        reconstruction = sae.decode(sae.encode(x)).float()
    error = ((x - reconstruction) ** 2).sum()
    return {"explained_variance": float(1 - error / ((x - x.mean(0)) ** 2).sum()),
            "relative_error": float(error / (x ** 2).sum()),
            "cosine": float(torch.nn.functional.cosine_similarity(x, reconstruction).mean())}


def halves(n: int) -> tuple[list[int], list[int]]:
    """(selection, evaluation) prompt indices: even and odd positions."""
    return list(range(0, n, 2)), list(range(1, n, 2))


def rank_features(acts, refused, rows=None):
    """Features by mean activation on refused minus answered prompts (over ``rows``, default all), largest first:
    (order, difference, mean refused, mean answered, firing rate refused, firing rate answered)."""
    import torch

    refused = torch.as_tensor(refused, dtype=torch.bool)
    if rows is not None:
        acts, refused = acts[list(rows)], refused[list(rows)]
    if refused.all() or not refused.any():
        raise ValueError("the ranking needs both refused and answered prompts")
    on, off = acts[refused], acts[~refused]
    difference = on.mean(0) - off.mean(0)
    order = torch.argsort(difference, descending=True)
    return order, difference, on.mean(0), off.mean(0), (on > 0).float().mean(0), (off > 0).float().mean(0)


def xstest_rates(records, completions, held_out: list[int]) -> dict:
    """False- and harmful-refusal rates on all prompts and on the held-out ones, with every completion."""
    from flowlens.refusals import score

    metrics, rows = score(records, completions)
    held = [rows[i] for i in held_out]

    def rate(kind):
        chosen = [r["refused"] for r in held if r["kind"] == kind]
        return sum(chosen) / len(chosen)

    return {"false_refusal_rate": metrics.false_refusal_rate, "harmful_refusal_rate": metrics.harmful_refusal_rate,
            "held_out": {"false_refusal_rate": rate("benign"), "harmful_refusal_rate": rate("harmful")},
            "refused_counts": metrics.refused_counts,
            "completions": [{k: r[k] for k in ("id", "label", "completion", "refused")} for r in rows]}


def main(argv: list[str] | None = None) -> int:
    from interp.cli import run_command

    parser = argparse.ArgumentParser(prog="python -m experiments.smollm2_refusal_features",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="r0.4-sft-s0", help="a plain-SFT cell of the SmolLM2 study")
    parser.add_argument("--sae", default=str(SAE_DIR))
    parser.add_argument("--top", type=int, nargs="+", default=[1, 5, 20], help="numbers of features ablated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fit-only", action="store_true",
                        help="recompute only the SAE's fit (base and fine-tuned residuals) into the existing results")
    parser.set_defaults(run=run)
    return run_command(parser.parse_args(argv))


def run(args) -> int:
    import torch

    from flowlens.steer import load_lm_sae
    from interp.hooks.lm import parse_hook_name
    from interp.hooks.lm_steer import LMEdit, generate

    from .smollm2_study import XSTEST_TOKENS, base_reference, committed_cell, residuals, train_cell, xstest_records

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cell = committed_cell(args.cell)
    if cell is None:
        raise FileNotFoundError(f"no committed cell {args.cell}; run `python -m experiments.smollm2_study run` first")
    ratio, seed = cell_settings(args.cell)
    sae, hook = load_lm_sae(args.sae)
    layer, _ = parse_hook_name(hook, 30)
    records = xstest_records()
    by_id = {c["id"]: c for c in cell["xstest"]["completions"]}
    refused = [bool(by_id[r.id]["refused"]) for r in records]
    model, tokenizer, _ = train_cell(args.cell, ratio, seed, cell["config"]["finetune"]["steps"], None)
    model.eval()
    from interp.models.generation import context_length
    from interp.models.lm import LanguageModel

    c = model.config
    lm = LanguageModel(model, tokenizer, n_layers=c.num_hidden_layers, d_model=c.hidden_size,
                       n_ctx=context_length(c), backend="hf", name=f"smollm2-135m-instruct ({args.cell})")
    x = torch.from_numpy(residuals(model, tokenizer, [r.prompt for r in records])[:, layer])
    fit = {"fine_tuned": sae_fit(sae, x), "base": sae_fit(sae, base_reference()[:, layer])}
    explained = fit["fine_tuned"]["explained_variance"]
    if args.fit_only:
        path = RESULTS / "smollm2_refusal_features.json"
        result = json.loads(path.read_text())
        result.update(sae_explained_variance=explained, sae_fit=fit)
        write_json(path, result)
        (RESULTS / "smollm2_refusal_features.md").write_text(markdown(result))
        print(json.dumps(fit, indent=1))
        return 0
    with torch.no_grad():
        acts = sae.encode(x).float()
    selection, held_out = halves(len(records))
    safe = [i for i in selection if records[i].kind == "benign"]
    cards = _cards(args.sae)
    n_listed = max(args.top + [N_CARDS])
    rankings = {}
    for ranking, rows in (("all", selection), ("safe", safe)):
        order, difference, mean_on, mean_off, rate_on, rate_off = rank_features(acts, refused, rows)
        rankings[ranking] = [
            {"feature": int(f), "difference": float(difference[f]), "mean_refused": float(mean_on[f]),
             "mean_answered": float(mean_off[f]), "fires_refused": float(rate_on[f]),
             "fires_answered": float(rate_off[f]), **cards.get(int(f), {})} for f in order[:n_listed]]

    prompts = [r.prompt for r in records]
    saes = {hook: sae}

    def measure(kind: str, features: list[int], edits: list | None = None) -> dict:
        edits = edits if edits is not None else [LMEdit(hook, "ablate", feature=f, positions="all") for f in features]
        completions = generate(lm, prompts, edits, saes, max_new_tokens=XSTEST_TOKENS, chat_template=True,
                               batch_size=64)
        out = {"ablated": features, "kind": kind, **xstest_rates(records, completions, held_out)}
        print(f"{kind} {len(features)}: FRR {out['false_refusal_rate']:.3f} HRR {out['harmful_refusal_rate']:.3f} "
              f"(held out {out['held_out']['false_refusal_rate']:.3f} / {out['held_out']['harmful_refusal_rate']:.3f})"
              f" at {time.perf_counter() - started:.0f} s", flush=True)
        return out

    # the baseline a feature ablation is read against: the refusal direction itself (difference of mean
    # residuals, refused minus answered, selection half), projected out at the SAE's layer and at every layer
    direction = (x[selection][torch.as_tensor(refused)[selection]].mean(0)
                 - x[selection][~torch.as_tensor(refused)[selection]].mean(0))
    runs = [measure("none", [])]
    for kind, hooks in ((f"direction (layer {layer})", [hook]),
                        ("direction (every layer)", [f"blocks.{l}.hook_resid_post" for l in range(c.num_hidden_layers)])):
        runs.append(measure(kind, [], [LMEdit(h, "ablate", direction=direction.tolist()) for h in hooks]))
    firing = torch.nonzero((acts[selection] > 0).any(0)).flatten()
    generator = torch.Generator().manual_seed(0)
    for n in args.top:
        for ranking, top in rankings.items():
            runs.append(measure(f"top ({ranking})", [f["feature"] for f in top[:n]]))
        runs.append(measure("random", [int(f) for f in firing[torch.randperm(len(firing), generator=generator)[:n]]]))
    result = {"cell": args.cell, "sae": str(args.sae), "hook": hook, "xstest_tokens": XSTEST_TOKENS,
              "cell_rates": {k: cell["xstest"][k] for k in ("false_refusal_rate", "harmful_refusal_rate")},
              "n_refused": sum(refused), "n_prompts": len(records), "n_selection": len(selection),
              "n_held_out": len(held_out), "sae_explained_variance": explained, "sae_fit": fit,
              "top_features": rankings, "runs": runs, "seconds": round(time.perf_counter() - started, 1)}
    write_json(RESULTS / "smollm2_refusal_features.json", result)
    (RESULTS / "smollm2_refusal_features.md").write_text(markdown(result))
    (RESULTS / "smollm2_refusal_features.html").write_text(cards_html(result, args.sae))
    print(markdown(result))
    return 0


def _cards(sae_dir) -> dict[int, dict]:
    """Feature -> its card's frequency, top-context snippets and promoted tokens (when cards are shipped)."""
    from saes.lm_features import load_lm_cards

    payload = load_lm_cards(sae_dir) or {"features": []}
    out = {}
    for card in payload["features"]:
        out[int(card["id"])] = {"frequency": card["frequency"], "promoted": [t["token"] for t in card["promoted"][:5]],
                                "contexts": [_snippet(c) for c in card["top_contexts"][:3]]}
    return out


def _snippet(context: dict) -> str:
    """The context's text with the top token in [brackets]."""
    pieces = list(context["tokens"])
    pieces[context["highlight"]] = f"[{pieces[context['highlight']]}]"
    return "".join(pieces).replace("\n", " ").strip()[:80]


def markdown(result: dict) -> str:
    base = result["runs"][0]
    text = (f"# Refusal features of SmolLM2 fine-tuned with safety data ({result['cell']})\n\n"
            f"Written by `python -m experiments.smollm2_refusal_features`. SAE: `{result['sae']}` at `{result['hook']}` "
            f"(trained on the base model) {_fit_text(result)}. {result['n_refused']} of {result['n_prompts']} XSTest prompts "
            f"refused by the fine-tuned model ({result['xstest_tokens']} new tokens, greedy). Features are chosen on "
            f"{result['n_selection']} prompts (even positions); *held out*: the other {result['n_held_out']}.\n\n")
    rows = []
    for run in result["runs"]:
        shown = ", ".join(map(str, run["ablated"][:6])) + (" ..." if len(run["ablated"]) > 6 else "")
        count = "a direction" if run["kind"].startswith("direction") else str(len(run["ablated"]))
        rows.append([run["kind"], count, shown, f"{run['false_refusal_rate']:.3f}",
                     f"{run['harmful_refusal_rate']:.3f}",
                     f"{run['false_refusal_rate'] - base['false_refusal_rate']:+.3f}",
                     f"{run['harmful_refusal_rate'] - base['harmful_refusal_rate']:+.3f}",
                     f"{run['held_out']['false_refusal_rate']:.3f}", f"{run['held_out']['harmful_refusal_rate']:.3f}"])
    text += markdown_table(["ablated", "features", "which", "false refusal", "harmful refusal", "Δ false",
                            "Δ harmful", "false (held out)", "harmful (held out)"], rows)
    for ranking, top in result["top_features"].items():
        over = "all prompts" if ranking == "all" else "safe prompts only"
        text += (f"\nTop features by mean activation on refused minus answered prompts ({over}, selection half, "
                 f"last prompt token):\n\n")
        text += markdown_table(["feature", "Δ mean", "fires (refused)", "fires (answered)", "promotes", "top contexts"],
                               [[str(f["feature"]), f"{f['difference']:.3f}", f"{f['fires_refused']:.2f}",
                                 f"{f['fires_answered']:.2f}",
                                 " ".join(repr(t).replace("|", "\\|") for t in f.get("promoted", [])),
                                 " / ".join(f.get("contexts", []))[:160].replace("|", "\\|")]
                                for f in top[:N_CARDS]])
    return text


def _fit_text(result: dict) -> str:
    fit = result.get("sae_fit")
    if fit is None:
        return f"(explained variance at the last prompt token: {result['sae_explained_variance']:.3f})"
    f, b = fit["fine_tuned"], fit["base"]
    return (f"(at the last prompt token of the XSTest prompts: relative error {f['relative_error']:.3f} on the fine-tuned "
            f"model's residuals against {b['relative_error']:.3f} on the base model's, cosine {f['cosine']:.3f} against "
            f"{b['cosine']:.3f}; explained variance around the prompts' mean {f['explained_variance']:.2f} against "
            f"{b['explained_variance']:.2f}, low because the prompts differ little there)")


def cards_html(result: dict, sae_dir) -> str:
    """The shipped cards (base-model corpus) of each ranking's top features, with their refusal statistics."""
    from html import escape

    from saes.lm_features import CSS, card_html, load_lm_cards

    payload = load_lm_cards(sae_dir) or {"features": []}
    by_id = {int(c["id"]): c for c in payload["features"]}
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Refusal features ({escape(result['cell'])})"
             f"</title><style>{CSS}</style></head><body><h1>Refusal features of {escape(result['cell'])} at "
             f"{escape(result['hook'])}</h1><p class='meta'>Features ranked by mean activation at the last prompt token "
             f"on XSTest prompts the fine-tuned model refused minus those it answered. The cards are the SAE's "
             f"shipped ones (the base model on its corpus).</p>"]
    shown: list[int] = []
    for ranking, top in result["top_features"].items():
        parts.append(f"<h2>Ranking over {'all' if ranking == 'all' else 'safe'} prompts</h2><ol>")
        for f in top[:N_CARDS]:
            parts.append(f"<li><a href='#f{f['feature']}'>#{f['feature']}</a>: Δ mean {f['difference']:.3f}; fires on "
                         f"{100 * f['fires_refused']:.0f}% of refused and {100 * f['fires_answered']:.0f}% of "
                         f"answered prompts</li>")
            if f["feature"] not in shown:
                shown.append(f["feature"])
        parts.append("</ol>")
    parts.append("<h2>Cards</h2>")  # each feature once, in the order the rankings name them
    parts += [card_html(by_id[f]) for f in shown if f in by_id]
    parts.append("</body></html>")
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
