"""Issue 19: which SAE features carry refusals in SmolLM2 fine-tuned with safety data, and what ablating them does.

    python -m experiments.smollm2_refusal_features [--cell r0.4-sft-s0] [--top 1 5 20]

The model is a cell of the SmolLM2 study (default: LoRA SFT at safety ratio 0.4, seed 0; its committed
cell JSON says which XSTest prompts it refused, and the fine-tune is redone from its checkpoint, or from
scratch, by ``smollm2_study.train_cell``). The SAE is the shipped one of the base model's layer 15
(``saes/pretrained/smollm2``); LoRA changed layers 10-29, so its fit on the fine-tuned model's residuals is
measured and reported (explained variance at the last prompt token).

1. Residuals at the last prompt token (chat template) of all 450 XSTest prompts at the SAE's hook, encoded.
2. Features ranked by the difference of mean activation between the prompts the model refused and those
   it answered (XSTest's string-match detector on the cell's greedy completions).
3. Generation with the top N features ablated (x - a_f d_f at every position, prompt and generated), for
   each N, and with N features drawn at random among those that fire on the prompts (a control): XSTest
   false-refusal and harmful-refusal rates, next to the same generation with no edit.

Writes ``experiments/results/smollm2_refusal_features.{json,md}``.
"""

from __future__ import annotations

import argparse
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


def rank_features(acts, refused):
    """(order, difference, mean refused, mean answered, firing rates) over features, largest difference first."""
    import torch

    refused = torch.as_tensor(refused, dtype=torch.bool)
    on, off = acts[refused], acts[~refused]
    difference = on.mean(0) - off.mean(0)
    order = torch.argsort(difference, descending=True)
    return order, difference, on.mean(0), off.mean(0), (on > 0).float().mean(0), (off > 0).float().mean(0)


def xstest_rates(records, completions) -> dict:
    from flowlens.refusals import score

    metrics, rows = score(records, completions)
    return {"false_refusal_rate": metrics.false_refusal_rate, "harmful_refusal_rate": metrics.harmful_refusal_rate,
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
    parser.set_defaults(run=run)
    return run_command(parser.parse_args(argv))


def run(args) -> int:
    import torch

    from flowlens.steer import load_lm_sae
    from interp.hooks.lm import parse_hook_name
    from interp.hooks.lm_steer import LMEdit, generate

    from .smollm2_study import XSTEST_TOKENS, committed_cell, residuals, train_cell, xstest_records

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
    with torch.no_grad():
        acts = sae.encode(x).float()
        reconstruction = sae.decode(acts)
    explained = float(1 - ((x - reconstruction) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())
    order, difference, mean_on, mean_off, rate_on, rate_off = rank_features(acts, refused)
    cards = _cards(args.sae)
    top = [{"feature": int(f), "difference": float(difference[f]), "mean_refused": float(mean_on[f]),
            "mean_answered": float(mean_off[f]), "fires_refused": float(rate_on[f]),
            "fires_answered": float(rate_off[f]), **cards.get(int(f), {})} for f in order[:max(args.top + [N_CARDS])]]

    prompts = [r.prompt for r in records]
    saes = {hook: sae}
    runs = [{"ablated": [], "kind": "none", **xstest_rates(records, generate(
        lm, prompts, max_new_tokens=XSTEST_TOKENS, chat_template=True, batch_size=64))}]
    firing = torch.nonzero((acts > 0).any(0)).flatten()
    generator = torch.Generator().manual_seed(0)
    for n in args.top:
        for kind, features in (("top", [int(f) for f in order[:n]]),
                               ("random", [int(f) for f in firing[torch.randperm(len(firing), generator=generator)[:n]]])):
            edits = [LMEdit(hook, "ablate", feature=f, positions="all") for f in features]
            completions = generate(lm, prompts, edits, saes, max_new_tokens=XSTEST_TOKENS, chat_template=True,
                                   batch_size=64)
            runs.append({"ablated": features, "kind": kind, **xstest_rates(records, completions)})
            print(f"{kind} {n}: FRR {runs[-1]['false_refusal_rate']:.3f} HRR {runs[-1]['harmful_refusal_rate']:.3f}",
                  flush=True)
    result = {"cell": args.cell, "sae": str(args.sae), "hook": hook, "xstest_tokens": XSTEST_TOKENS,
              "cell_rates": {k: cell["xstest"][k] for k in ("false_refusal_rate", "harmful_refusal_rate")},
              "n_refused": sum(refused), "n_prompts": len(records), "sae_explained_variance": explained,
              "top_features": top, "runs": runs, "seconds": round(time.perf_counter() - started, 1)}
    write_json(RESULTS / "smollm2_refusal_features.json", result)
    (RESULTS / "smollm2_refusal_features.md").write_text(markdown(result))
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
            f"(trained on the base model; explained variance on the fine-tuned model's last-prompt-token residuals: "
            f"{result['sae_explained_variance']:.3f}). {result['n_refused']} of {result['n_prompts']} XSTest prompts "
            f"refused by the fine-tuned model ({result['xstest_tokens']} new tokens, greedy).\n\n")
    rows = []
    for n_runs in result["runs"]:
        rows.append([n_runs["kind"], str(len(n_runs["ablated"])), ", ".join(map(str, n_runs["ablated"][:8]))
                     + (" ..." if len(n_runs["ablated"]) > 8 else ""), f"{n_runs['false_refusal_rate']:.3f}",
                     f"{n_runs['harmful_refusal_rate']:.3f}",
                     f"{n_runs['false_refusal_rate'] - base['false_refusal_rate']:+.3f}",
                     f"{n_runs['harmful_refusal_rate'] - base['harmful_refusal_rate']:+.3f}"])
    text += markdown_table(["ablated", "features", "which", "false refusal", "harmful refusal", "Δ false", "Δ harmful"],
                           rows)
    text += "\nTop features by mean activation on refused minus answered prompts (last prompt token):\n\n"
    text += markdown_table(["feature", "Δ mean", "fires (refused)", "fires (answered)", "promotes", "top contexts"],
                           [[str(f["feature"]), f"{f['difference']:.3f}", f"{f['fires_refused']:.2f}",
                             f"{f['fires_answered']:.2f}",
                             " ".join(repr(t) for t in f.get("promoted", [])),
                             " / ".join(f.get("contexts", []))[:160]] for f in result["top_features"][:N_CARDS]])
    return text


if __name__ == "__main__":
    sys.exit(main())
