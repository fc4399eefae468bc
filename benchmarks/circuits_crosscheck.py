"""Cross-check of `saes.circuits.attribute` with circuit-tracer 0.5.0's own attribution (issue 45).

    python -m benchmarks.circuits_crosscheck [--transcoders saes/pretrained/toy-chat-transcoders] [--out FILE]

One graph, the same model weights, transcoders and prompt, computed twice: by this workbench (Hugging Face model,
`interp.hooks.lm_replace`) and by circuit-tracer's `attribute` on its `TransformerLensReplacementModel` (the toy
chat model converted to TransformerLens by the workbench's own `load_lm(backend="transformer_lens")`, the
transcoders copied into circuit-tracer's `SingleLayerTranscoder` / `TranscoderSet`, writing `hook_mlp_out`).
A HookedTransformer has no hook on the MLP's input after ln2's gain and bias (what the workbench's transcoders read,
`blocks.L.mlp.hook_in`): circuit-tracer's copies read `ln2.hook_normalized` (before them), with the gain and bias
folded into their encoder (W_enc' = diag(w) W_enc, b_enc' = b_enc + b W_enc: the same pre-activations). Both order nodes the same way ([features by (layer, position,
feature)], errors, tokens, logits), so the adjacency matrices are compared entry by entry: Pearson correlation of
every edge either graph has, the largest difference, and the pruned node sets.

circuit-tracer installs with `pip install --no-deps circuit-tracer==0.5.0` (requirements-anchors.txt). On this stack
one import fails: `circuit_tracer.utils.hf_utils` imports `HF_HUB_ENABLE_HF_TRANSFER` from
`huggingface_hub.constants`, which huggingface_hub 1.x no longer defines (it is only read when downloading
transcoders from the hub). This script sets that constant to False before importing circuit-tracer; nothing else of
its code is changed.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

PROMPT = "Sort: 84 48 7"


def circuit_tracer_graph(lm_tl, transcoders: dict, ids: list[int]):
    import huggingface_hub.constants as constants

    if not hasattr(constants, "HF_HUB_ENABLE_HF_TRANSFER"):
        constants.HF_HUB_ENABLE_HF_TRANSFER = False  # the one shim: see the module's docstring
    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.activation_functions import JumpReLU
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet

    theirs = {}
    for layer, tc in transcoders.items():
        if tc.cfg.architecture != "jumprelu":
            raise SystemExit("the cross-check copies JumpReLU transcoders (circuit-tracer has no TopK one)")
        plt = SingleLayerTranscoder(tc.cfg.d_in, tc.cfg.d_sae, JumpReLU(tc.threshold.detach().clone()), layer,
                                    skip_connection=tc.cfg.skip, device=torch.device("cpu"), dtype=torch.float32)
        ln2 = lm_tl.model.blocks[layer].ln2
        w, b = ln2.w.detach().float(), ln2.b.detach().float()
        with torch.no_grad():
            plt.W_enc.copy_((w[:, None] * tc.W_enc).T)
            plt.b_enc.copy_(tc.b_enc + b @ tc.W_enc)
            plt.W_dec.copy_(tc.W_dec)
            plt.b_dec.copy_(tc.b_dec + (b @ tc.W_skip.T if tc.cfg.skip else 0))
            if tc.cfg.skip:
                plt.W_skip.copy_(tc.W_skip * w[None, :])
        theirs[layer] = plt
    tset = TranscoderSet(theirs, feature_input_hook="ln2.hook_normalized", feature_output_hook="hook_mlp_out",
                         scan="toy-chat-transcoders")
    model = lm_tl.model
    model.__class__ = TransformerLensReplacementModel  # the HookedTransformer the workbench converted, in place
    model._configure_replacement_model(tset)
    model.tokenizer = lm_tl.tokenizer
    return attribute(torch.tensor(ids), model, max_n_logits=10, desired_logit_prob=0.95, batch_size=64)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transcoders", default="saes/pretrained/toy-chat-transcoders")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--out", default="experiments/results/circuits_crosscheck.json")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from interp.models.lm import load_lm
    from saes.circuits import attribute, load_transcoders, prune, tokenize_prompt

    lm = load_lm("toy-chat")
    transcoders = load_transcoders(args.transcoders, lm, model_name="toy-chat")
    ids = tokenize_prompt(lm, args.prompt, chat=True)
    started = time.perf_counter()
    ours = attribute(lm, transcoders, ids, model_name="toy-chat")
    ours_s = time.perf_counter() - started
    lm_tl = load_lm("toy-chat", backend="transformer_lens")
    started = time.perf_counter()
    theirs = circuit_tracer_graph(lm_tl, transcoders, ids)
    theirs_s = time.perf_counter() - started

    from circuit_tracer.graph import prune_graph

    same_features = torch.equal(theirs.active_features.long(), ours.features.long())
    if not same_features:
        a_set = {tuple(r) for r in ours.features.tolist()}
        b_set = {tuple(r) for r in theirs.active_features.tolist()}
        print("features: ours", len(a_set), "theirs", len(b_set), "only ours", sorted(a_set - b_set)[:10],
              "only theirs", sorted(b_set - a_set)[:10], "shape", tuple(theirs.active_features.shape))
    same_logits = [t.vocab_idx for t in theirs.logit_targets] == ours.logit_tokens
    a, b = ours.adjacency.double(), theirs.adjacency_matrix.double()
    result = {"prompt": args.prompt, "chat_template": True, "tokens": len(ids),
              "same_active_features": same_features, "same_logit_targets": same_logits,
              "features": ours.n_features, "nodes": int(a.shape[0])}
    if same_features and same_logits and a.shape == b.shape:
        edges = (a != 0) | (b != 0)
        x, y = a[edges], b[edges]
        corr = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
        ours_pruned, theirs_pruned = prune(ours), prune_graph(theirs)
        result.update(edges=int(edges.sum()), pearson=corr,
                      max_abs_difference=float((a - b).abs().max()), max_abs_edge=float(a.abs().max()),
                      max_abs_difference_by_source={
                          name: float((a - b)[:, cols].abs().max()) for name, cols in (
                              ("features", slice(0, ours.error_start)),
                              ("errors", slice(ours.error_start, ours.token_start)),
                              ("tokens", slice(ours.token_start, ours.logit_start)))},
                      max_abs_difference_error_columns_by_position=[
                          float((a - b)[:, [ours.error_index(l, pos) for l in range(ours.n_layers)]].abs().max())
                          for pos in range(ours.n_pos)],
                      max_abs_difference_by_target={
                          "features": float((a - b)[:ours.n_features].abs().max()),
                          "logits": float((a - b)[ours.logit_start:].abs().max())},
                      pruned_nodes_ours=int(ours_pruned.node_mask.sum()),
                      pruned_nodes_theirs=int(theirs_pruned.node_mask.sum()),
                      pruned_nodes_same=bool(torch.equal(ours_pruned.node_mask, theirs_pruned.node_mask)))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if "Model name" in line),
                      platform.processor())
    result.update(seconds_ours=ours_s, seconds_circuit_tracer=theirs_s, cpu=model_name,
                  note="2-core CPU shared with other jobs while measured; times are wall time under that load",
                  command="python -m benchmarks.circuits_crosscheck")
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
