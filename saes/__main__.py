"""python -m saes {train,eval,features,causal,report,probe,export,import-sdxl,bench} ...

    python -m saes train --store runs/store --block unet.mid_block.attentions.0 --out runs/sae/mid
    python -m saes eval --sae runs/sae/mid --store runs/store --block unet.mid_block.attentions.0
    python -m saes eval --sae runs/sae/mid --world 64 --model toy          (+ splice-in fidelity)
    python -m saes eval --sae runs/sae/l2 --model toy-chat --text heldout.jsonl --tokens 20000   (LM: CE, KL)
    python -m saes features --model toy --sae saes/pretrained/toy --world 400 --out runs/features
    python -m saes features --sae runs/lm-sae/blocks.2.hook_resid_post --model toy-chat --text corpus.jsonl  (LM)
    python -m saes causal --model toy --sae runs/toy-saes --scenes 24       (causal label scores into the cards)
    python -m saes report --model toy --root saes/pretrained/toy --features-summary runs/features/features_summary.json
    python -m saes export --sae saes/pretrained/smollm2/blocks.15.hook_resid_post --format saedashboard --out runs/np
    python -m saes bench --sae saes/pretrained/toy-chat/blocks.1.hook_resid_post --model toy-chat --evals core
    python -m saes import-sdxl --checkpoint down.2.1_k10_hidden5120_auxk256_bs4096_lr0.0001/final --out runs/sae/down21
    torchrun --nproc-per-node 2 -m saes train ...      (data-parallel; each rank reads its own share)
"""

from __future__ import annotations

import argparse
import sys

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from interp.cli import run_command
from interp.shipped import add_overwrite_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m saes", description="Train, evaluate and import SAEs.")
    commands = parser.add_subparsers(dest="command", required=True)

    from .bench.run import add_bench_arguments, bench_command
    from .causal import add_causal_arguments, causal_command
    from .circuits import add_fidelity_arguments, add_graph_arguments, fidelity_command, graph_command
    from .evaluate import add_eval_arguments
    from .export import add_export_arguments, export_command
    from .features import add_features_arguments
    from .importers import add_import_sdxl_arguments, import_sdxl_command
    from .lm_eval import eval_command
    from .lm_features import features_command
    from .report import add_probe_arguments, add_report_arguments, probe_command, report_command
    from .train import add_train_arguments, train_command

    for name, help_text, add_arguments, command in (
        ("train", "train an SAE on one block of an activation store (resumable)", add_train_arguments, train_command),
        ("eval", "explained variance, L0, dead and dense features, and with --model splice-in fidelity (JSON + "
                 "markdown)", add_eval_arguments, eval_command),
        ("features", "feature cards: frequency, mean activation, top images with heatmaps, shapes-world labels by "
                     "AUROC (JSON + HTML)", add_features_arguments, features_command),
        ("causal", "causal label scores: how often painting a labelled feature into held-out objects makes the "
                   "probe read its label (into features.json)", add_causal_arguments, causal_command),
        ("report", "evaluation report of a model's SAEs: EV, L0, dead, splice fidelity, which blocks carry which "
                   "attributes (REPORT.md + report.json)", add_report_arguments, report_command),
        ("probe", "where a model codes each attribute, before any SAE: linear probes, dimensions, the one-direction "
                  "ceiling and the mixture distance per value in every block (shapes world)", add_probe_arguments,
         probe_command),
        ("export", "feature cards in the field's viewer formats: SAEDashboard's Neuronpedia batches or "
                   "Neuronpedia's bulk-import tree (text and image SAEs)", add_export_arguments, export_command),
        ("import-sdxl", "convert a published SDXL Turbo SAE (state_dict.pth) to sae-lens format",
         add_import_sdxl_arguments, import_sdxl_command),
        ("bench", "SAEBench's evals (core, sparse probing, ...) on a CPU, one SAEBench JSON per SAE and eval",
         add_bench_arguments, bench_command),
        ("graph", "a prompt's attribution graph from per-layer transcoders (circuit-tracer's JSON), and feature "
                  "ablations beside its predictions", add_graph_arguments, graph_command),
        ("transcoder-eval", "the replacement model's fidelity with every MLP replaced by its transcoder (CE "
                            "recovered, KL)", add_fidelity_arguments, fidelity_command),
    ):
        sub = commands.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(run=command)

    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted; run the same command again to resume")


if __name__ == "__main__":
    sys.exit(main())
