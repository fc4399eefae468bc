"""Faithfulness of attribution graphs (issue 45): does the graph predict what ablating its top features does?

    python -m benchmarks.circuits_faithfulness --model smollm2-135m-instruct \\
        --transcoders saes/pretrained/smollm2-transcoders [--top 10] [--max-feature-nodes 512] \\
        --out experiments/results/circuits_faithfulness_smollm2.json
    python -m benchmarks.circuits_faithfulness --model toy-chat \\
        --transcoders saes/pretrained/toy-chat-transcoders --out experiments/results/circuits_faithfulness_toy_chat.json

For each of 20 fixed prompts (SmolLM2: the list below, written before any graph was drawn; toy-chat: the held-out
chat-world prompts of experiments/circuits_toy.py), the graph of its next token; its ``--top`` feature nodes by
circuit-tracer's node influence (the pruning's score: influence on the logits through every path, from
|A| row-normalised) are ablated one at a time, and the change of the top target's demeaned logit is measured
three ways:

- ``predicted``: the graph's linear prediction (`saes.circuits.predicted_effects`: the ablation propagated
  through the graph's feature-to-feature edges, attention and norm scales frozen, errors fixed, every other
  feature staying active);
- ``replacement``: the replacement model run forward (`saes.circuits.replacement_effects`: every MLP its
  transcoder, features re-encoded so they can switch off or on, errors fixed, attention and norms live);
- ``real``: the real model (`saes.circuits.real_effects`: the feature's decoder write removed from its MLP's
  output at its position; attention, norms and every later MLP the model's own).

Reported: sign agreement of predicted vs real over all ablations (the issue's figure; a pair counts as agreeing
when both changes have the same sign, and a zero on either side counts as a disagreement), and again over the
ablations whose real change is at least 0.01, 0.1 and 0.5 logits in size (how many each is stated); Spearman
pooled over all ablations and the median of per-prompt Spearman; the same between predicted and replacement and
between replacement and real, which splits a disagreement into the part of the linear frozen graph and the part
of the transcoders.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

SMOLLM2_PROMPTS = (
    "The capital of France is",
    "One, two, three, four,",
    "The opposite of hot is",
    "Monday, Tuesday, Wednesday,",
    "The cat sat on the",
    "Water freezes at zero degrees",
    "The sun rises in the",
    "She opened the door and walked into the",
    "A B C D E",
    "The largest planet in our solar system is",
    "Paris is to France as Berlin is to",
    "2 + 2 =",
    "The color of the sky on a clear day is",
    "Roses are red, violets are",
    "To be or not to",
    "January, February, March,",
    "The chemical symbol for gold is",
    "He drank a glass of cold",
    "The first president of the United States was George",
    "Once upon a",
)
THRESHOLDS = (0.01, 0.1, 0.5)


def _agreement(a: list[float], b: list[float]) -> float | None:
    pairs = list(zip(a, b))
    return sum((x > 0 and y > 0) or (x < 0 and y < 0) for x, y in pairs) / len(pairs) if pairs else None


def _compare(name_a: str, a: list[float], name_b: str, b: list[float], by_prompt: list[slice]) -> dict:
    from saes.circuits import spearman

    per_prompt = [spearman(a[s], b[s]) for s in by_prompt]
    finite = [r for r in per_prompt if r == r]
    out = {"pair": f"{name_a} vs {name_b}", "n": len(a), "sign_agreement": _agreement(a, b),
           "spearman_pooled": spearman(a, b),
           "spearman_median_per_prompt": float(torch.tensor(finite).median()) if finite else None,
           "by_real_magnitude": {}}
    for t in THRESHOLDS:
        keep = [i for i, y in enumerate(b) if abs(y) >= t]
        out["by_real_magnitude"][f">={t}"] = {"n": len(keep), "sign_agreement": _agreement(
            [a[i] for i in keep], [b[i] for i in keep])}
    return out


def first_order(lm, graph, transcoders, node: int, freeze_attention: bool, freeze_norms: bool) -> float:
    """The real model's first-order change of the top target's demeaned logit when feature ``node`` is ablated:
    -d logit / d t at t = 0, with t * (activation x decoder row) added to its MLP's output at its position; the
    real MLPs downstream; attention patterns and norm scales frozen as asked (both frozen: the graph's model,
    with the real MLPs in place of the transcoders; neither: the model's own gradient)."""
    from interp.hooks.lm_replace import ReplacementPass
    from saes.circuits import _unembedding

    layer, pos, feat = graph.features[node].tolist()
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    write = float(graph.activations[node]) * transcoders[layer].W_dec[feat].double()

    def replace(at, x, y):
        if at != layer:
            return y
        bump = torch.zeros_like(y, dtype=torch.float64)
        bump[:, pos] = write
        return y + (t * bump).to(y.dtype)

    unembed, scale = _unembedding(lm)
    target = graph.logit_tokens[0]
    ids = torch.tensor([graph.tokens])
    with ReplacementPass(lm, replace, freeze_attention=freeze_attention, freeze_norms=freeze_norms) as session:
        lm.model(input_ids=ids)
        final = session.final[0, -1]
        logit = (final.double() * ((unembed[target] - unembed.mean(0)).double() * scale)).sum()
        (grad,) = torch.autograd.grad(logit, [t])
    return -float(grad)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--transcoders", default="saes/pretrained/smollm2-transcoders")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--scale", type=float, default=0.0,
                        help="each feature set to this times its activation (0: ablated, the issue's figure; 0.9: a "
                             "small step, where a first-order graph should agree best)")
    parser.add_argument("--first-order", action="store_true",
                        help="also the real model's first-order change with attention and norms frozen or live "
                             "(which freezing makes the graph disagree)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= 100 or not 1 <= args.top <= 100:
        parser.error("--prompts and --top must be in 1..100")
    torch.set_num_threads(args.threads)

    import zoo  # noqa: F401 - the embedded models
    from interp.models.lm import load_lm
    from saes.circuits import (attribute, graph_scores, load_transcoders, predicted_effects, real_effects,
                               replacement_effects, top_feature_nodes)

    lm = load_lm(args.model)
    transcoders = load_transcoders(args.transcoders, lm, model_name=args.model)
    chat = args.model == "toy-chat"
    if chat:
        from experiments.circuits_toy import faithfulness_prompts
        prompts = faithfulness_prompts(args.prompts)
    else:
        prompts = list(SMOLLM2_PROMPTS[:args.prompts])
    started = time.perf_counter()
    rows, slices = [], []
    pred, repl, real = [], [], []
    orders: dict[str, list[float]] = {}
    for prompt in prompts:
        t0 = time.perf_counter()
        graph = attribute(lm, transcoders, prompt, chat=chat, model_name=args.model, batch_size=args.batch_size,
                          max_feature_nodes=args.max_feature_nodes)
        nodes = top_feature_nodes(graph, args.top)
        p = [float(predicted_effects(graph, [n], scale=args.scale)[0]) for n in nodes]
        q = [float(replacement_effects(lm, graph, transcoders, [n], scale=args.scale)[0]) for n in nodes]
        r = [float(real_effects(lm, graph, transcoders, [n], scale=args.scale)[0]) for n in nodes]
        direct = [-float(graph.adjacency[graph.logit_start, n]) for n in nodes]
        if args.first_order:
            for key, fa, fn in (("both_frozen", True, True), ("attention_frozen", True, False),
                                ("norms_frozen", False, True), ("none_frozen", False, False)):
                orders.setdefault(key, []).extend(first_order(lm, graph, transcoders, n, fa, fn) for n in nodes)
        slices.append(slice(len(pred), len(pred) + len(nodes)))
        pred += p
        repl += q
        real += r
        rows.append({"prompt": prompt, "tokens": len(graph.tokens), "target": graph.logit_strings[0],
                     "target_probability": float(graph.logit_probabilities[0]),
                     "active_features": graph.info["n_active_features"], "feature_nodes": graph.n_features,
                     **graph_scores(graph), "seconds": time.perf_counter() - t0,
                     "nodes": [{"layer": int(graph.features[n, 0]), "position": int(graph.features[n, 1]),
                                "feature": int(graph.features[n, 2]), "activation": float(graph.activations[n]),
                                "direct": d, "predicted": a, "replacement": b, "real": c}
                               for n, d, a, b, c in zip(nodes, direct, p, q, r)]})
        print(f"{prompt!r} -> {graph.logit_strings[0]!r}: {graph.n_features} features, "
              f"agreement {_agreement(p, r)}, {time.perf_counter() - t0:.0f}s", flush=True)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    result = {
        "model": args.model, "transcoders": args.transcoders, "prompts": len(prompts), "top": args.top,
        "ablations": len(pred), "max_feature_nodes": args.max_feature_nodes, "scale": args.scale,
        "top_nodes": "the feature nodes of largest node influence (saes.circuits.top_feature_nodes)",
        "measure": "change of the top target's demeaned logit when one feature is set to scale x its activation "
                   "(0: ablated)",
        "headline": _compare("predicted", pred, "real", real, slices),
        "predicted_vs_replacement": _compare("predicted", pred, "replacement", repl, slices),
        "replacement_vs_real": _compare("replacement", repl, "real", real, slices),
        "first_order_vs_real": {key: _compare(f"first order, {key.replace('_', ' ')}", values, "real", real, slices)
                                for key, values in orders.items()},
        "first_order_vs_predicted": {key: _compare(f"first order, {key.replace('_', ' ')}", values, "predicted",
                                                   pred, slices) for key, values in orders.items()},
        "seconds": time.perf_counter() - started,
        "cpu": next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line),
                    platform.processor()),
        "note": "2-core machine shared with other jobs; seconds are wall time under that load",
        "per_prompt": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("headline", "predicted_vs_replacement", "replacement_vs_real")},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
