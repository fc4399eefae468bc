"""Issue 45: attribution graphs on the toy chat model with its shipped transcoders.

    python -m experiments.circuits_toy [--prompts 20] [--top 10]

1. the worked example: the graph of "Sort: 84 48 7" (chat template, assistant turn opened) for its first output
   token, written in circuit-tracer's JSON (experiments/results/circuits_toy_sort.json);
2. faithfulness on held-out chat-world prompts with a numeric answer (sort, max, min): for each prompt's graph,
   the `--top` most influential features are ablated one at a time in the real model (decoder contribution
   removed at their layer and position) beside the graph's linear prediction of the change of the top target's
   demeaned logit: sign agreement and Spearman's rank correlation, per prompt and pooled.

Results: experiments/results/circuits_toy_chat.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
TRANSCODERS = Path(__file__).resolve().parents[1] / "saes" / "pretrained" / "toy-chat-transcoders"
EXAMPLE = "Sort: 84 48 7"


def faithfulness_prompts(n: int) -> list[str]:
    from zoo.chat.world import World, WorldConfig

    world = World(WorldConfig(seed=0))
    rows = world.mixture("held_out", 4000, {"general": 1.0}, seed=11)
    keep = [r["prompt"] for r in rows if r["prompt"].split(":")[0].lower().split()[0] in ("sort", "max", "min",
                                                                                           "which", "what")]
    return [p for p in dict.fromkeys(keep) if any(c.isdigit() for c in p)][:n]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from interp.models.lm import load_lm
    from saes.circuits import (attribute, graph_scores, load_transcoders, predicted_effects, prune, real_effects,
                               spearman, top_feature_nodes, write_graph_files)

    lm = load_lm("toy-chat")
    transcoders = load_transcoders(TRANSCODERS, lm, model_name="toy-chat")
    started = time.perf_counter()
    example = attribute(lm, transcoders, EXAMPLE, chat=True, model_name="toy-chat", scan="toy-chat-transcoders")
    example_seconds = time.perf_counter() - started
    write_graph_files(example, RESULTS, "circuits_toy_sort")
    pruned = prune(example)
    top = top_feature_nodes(example, 10, pruned)
    example_rows = []
    for node in top:
        layer, pos, feat = example.features[node].tolist()
        example_rows.append({"node": node, "layer": layer, "position": pos, "token": example.token_strings[pos],
                             "feature": feat, "activation": float(example.activations[node]),
                             "influence": float(pruned.node_influence[node]),
                             "direct_effect_on_target": float(example.adjacency[example.logit_start, node]),
                             "predicted_ablation": float(predicted_effects(example, [node])[0]),
                             "real_ablation": float(real_effects(lm, example, transcoders, [node])[0])})
    per_prompt, pooled_p, pooled_r = [], [], []
    for prompt in faithfulness_prompts(args.prompts):
        graph = attribute(lm, transcoders, prompt, chat=True, model_name="toy-chat")
        nodes = top_feature_nodes(graph, args.top)
        predicted = [float(predicted_effects(graph, [n])[0]) for n in nodes]
        real = [float(real_effects(lm, graph, transcoders, [n])[0]) for n in nodes]
        agree = [(p > 0) == (r > 0) for p, r in zip(predicted, real) if p != 0 and r != 0]
        per_prompt.append({"prompt": prompt, "target": graph.logit_strings[0],
                           "target_probability": float(graph.logit_probabilities[0]), "features": graph.n_features,
                           **graph_scores(graph), "sign_agreement": sum(agree) / max(len(agree), 1),
                           "spearman": spearman(predicted, real), "predicted": predicted, "real": real})
        pooled_p += predicted
        pooled_r += real
    agree = [(p > 0) == (r > 0) for p, r in zip(pooled_p, pooled_r) if p != 0 and r != 0]
    result = {
        "model": "toy-chat", "transcoders": "saes/pretrained/toy-chat-transcoders",
        "example": {"prompt": EXAMPLE, "chat_template": True, "targets": example.logit_strings,
                    "probabilities": example.logit_probabilities.tolist(), "features": example.n_features,
                    "kept_nodes": int(pruned.node_mask.sum()), "kept_edges": int(pruned.edge_mask.sum()),
                    "seconds": example_seconds, **graph_scores(example), "top_features": example_rows},
        "faithfulness": {"prompts": len(per_prompt), "top_features_per_prompt": args.top,
                         "ablations": len(pooled_p), "sign_agreement": sum(agree) / max(len(agree), 1),
                         "spearman_pooled": spearman(pooled_p, pooled_r),
                         "spearman_median_per_prompt": float(torch.tensor(
                             [p["spearman"] for p in per_prompt]).nanmedian()),
                         "per_prompt": per_prompt},
        "machine_note": "2-core CPU shared with other jobs; seconds are wall time under that load",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "circuits_toy_chat.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Attribution graphs on toy-chat\n",
             f"Worked example: `{EXAMPLE}` (chat template), targets {example.logit_strings} "
             f"(p = {', '.join(f'{p:.3f}' for p in example.logit_probabilities.tolist())}); "
             f"{example.n_features} active features, {result['example']['kept_nodes']} nodes and "
             f"{result['example']['kept_edges']} edges after pruning; replacement score "
             f"{result['example']['replacement_score']:.3f}, completeness {result['example']['completeness_score']:.3f}; "
             f"{example_seconds:.1f} s.\n",
             "| layer | position (token) | feature | activation | influence | direct effect | predicted ablation | "
             "real ablation |", "|---|---|---|---|---|---|---|---|"]
    for row in example_rows:
        lines.append(f"| {row['layer']} | {row['position']} ({row['token']!r}) | {row['feature']} | "
                     f"{row['activation']:.2f} | {row['influence']:.3f} | {row['direct_effect_on_target']:+.3f} | "
                     f"{row['predicted_ablation']:+.3f} | {row['real_ablation']:+.3f} |")
    f = result["faithfulness"]
    lines += ["", f"Faithfulness: {f['prompts']} held-out prompts, top {f['top_features_per_prompt']} features each "
              f"({f['ablations']} single-feature ablations): sign agreement {f['sign_agreement']:.3f}, Spearman "
              f"pooled {f['spearman_pooled']:.3f}, median per prompt {f['spearman_median_per_prompt']:.3f}.", ""]
    (RESULTS / "circuits_toy_chat.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
