"""Attribution graphs from per-layer transcoders, on a CPU (the method of circuit-tracer 0.5.0 / Ameisen et al.
2025, written here from its equations).

For a prompt, the **local replacement model** is the model with every attention pattern and norm scale frozen
at their values in the real forward pass, and every MLP replaced by its transcoder plus an **error node** (what
the transcoder misses at that layer and position, held constant): `interp.hooks.lm_replace` runs it, and its
logits are the model's own. That model is linear in the residual stream between nodes, so the **direct effect**
of a source node s on a target node t is exact:

    A[t, s] = value_s * (write_s . d t / d (stream where s writes))

- sources: active transcoder features (value: activation a_s, written: W_dec[s] at its layer's MLP output),
  error nodes (the error vector there), token embeddings (the input embedding's output);
- targets: features (their pre-activation, read as W_enc[:, s] . MLP input) and logits (the final stream times
  the unembedding row minus the vocabulary's mean row: circuit-tracer's demeaned logit).

Node order is circuit-tracer's: [features, errors (layer-major, L * P), tokens (P), logits]; rows are targets,
columns sources. A feature's pre-activation equals the sum of its row plus b_enc (exactly, in the frozen
model); a logit equals its row's sum plus the constant the model's biases add (zero in a model without biases:
the suite's exactness test). Pruning (`prune`) and the JSON (`graph_json`) follow circuit-tracer's graph.py and
utils/create_graph_files.py: node influence from the row-normalised |A| summed over all path lengths, nodes kept
to 0.8 of it, edges to 0.98, so its frontend loads the graph.

Interventions (`intervene`): ablate or scale feature nodes in the *real* model (their decoder contribution
removed or scaled at that layer and position; everything downstream recomputed by the real model), beside
the graph's linear prediction of the same change.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from interp.cli import add_out_argument

from .sae import SAE, SAEFormatError, load_sae_set

# Bounds of one request (checked before any work).
MAX_LOGITS = 50
MAX_BATCH = 1024
MAX_FEATURE_NODES = 20_000  # the dense adjacency of 20k nodes is 1.6 GB in float32


class GraphError(ValueError):
    """A graph request that cannot be answered; the message says why and what works."""


# ----------------------------------------------------------------------------- transcoders

def load_transcoders(root: str | os.PathLike, lm, model_name: str | None = None) -> dict[int, SAE]:
    """{layer: transcoder} from ``root/<blocks.L.mlp.hook_in>/`` (one sae-lens directory each), checked
    against the model: a transcoder for every layer, each reading and writing d_model, trained on this model."""
    from interp.hooks.lm import parse_hook_name

    try:
        found = load_sae_set(root)
    except SAEFormatError as err:
        raise GraphError(str(err)) from None
    by_layer: dict[int, SAE] = {}
    for name, sae in found.items():
        if not sae.cfg.transcoder:
            raise GraphError(f"{root}/{name} is an SAE, not a transcoder (its cfg.json's architecture is "
                             f"{sae.cfg.architecture}); graphs need transcoders (saes train --architecture "
                             "batchtopk-transcoder)")
        hook = sae.cfg.metadata.get("hook_name", name)
        layer, kind = parse_hook_name(hook, lm.n_layers) if hook.startswith("blocks.") else (None, None)
        if kind != "mlp_in":
            raise GraphError(f"{root}/{name} reads {hook!r}, not an MLP's input (blocks.L.mlp.hook_in)")
        if sae.cfg.d_in != lm.d_model or sae.cfg.d_out != lm.d_model:
            raise GraphError(f"the transcoder of layer {layer} maps {sae.cfg.d_in} -> {sae.cfg.d_out} channels, "
                             f"but {lm.name} has d_model={lm.d_model}: it was trained on another model")
        trained_on = sae.cfg.metadata.get("model_name")
        if model_name and trained_on and trained_on != model_name:
            raise GraphError(f"the transcoders in {root} were trained on {trained_on}, not on {model_name}: use "
                             f"transcoders of {model_name}, or --model {trained_on}")
        by_layer[layer] = sae.eval()
    missing = [layer for layer in range(lm.n_layers) if layer not in by_layer]
    if missing:
        raise GraphError(f"{root} has no transcoder for layer(s) {', '.join(map(str, missing))} of {lm.n_layers}: the "
                         "replacement model needs one for every layer")
    return by_layer


def _feature_mask(sae: SAE, acts: torch.Tensor) -> torch.Tensor:
    return acts != 0


# ----------------------------------------------------------------------------- the graph

@dataclass
class AttributionGraph:
    """One prompt's unpruned graph (circuit-tracer's node order; see the module's docstring)."""

    prompt: str
    tokens: list[int]
    token_strings: list[str]
    n_layers: int
    features: torch.Tensor            # (F, 3) long: layer, position, feature index
    activations: torch.Tensor         # (F,)
    logit_tokens: list[int]
    logit_strings: list[str]
    logit_probabilities: torch.Tensor  # (n_logits,)
    adjacency: torch.Tensor           # (N, N): [target, source]
    values: torch.Tensor              # (N,): feature activations, error norms, embedding norms, demeaned logits
    feature_inputs: torch.Tensor      # (F,): each feature's pre-activation minus b_enc, from the forward pass
    decoder_bias_effects: torch.Tensor | None = None
    model_name: str = ""
    scan: str = ""
    error_norms: torch.Tensor | None = None  # (L, P)
    info: dict = field(default_factory=dict)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def error_start(self) -> int:
        return self.n_features

    @property
    def token_start(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_start(self) -> int:
        return self.token_start + self.n_pos

    def error_index(self, layer: int, position: int) -> int:
        return self.error_start + layer * self.n_pos + position


def tokenize_prompt(lm, prompt: str, chat: bool = False) -> list[int]:
    """The prompt's token ids as the model reads it (its start token included; ``chat``: in its chat template,
    with the assistant's turn opened). A prompt past the model's context is refused."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise GraphError("the prompt is empty")
    if chat:
        from interp.hooks.lm import format_prompts

        text = format_prompts(lm.tokenizer, [prompt], chat_template=True)[0]
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = lm.tokenizer(prompt)["input_ids"]
    if len(ids) > lm.n_ctx:
        raise GraphError(f"the prompt has {len(ids)} tokens, past the model's context of {lm.n_ctx}")
    return list(ids)


def _target_ids(lm, targets, probabilities: torch.Tensor) -> list[int]:
    vocab = probabilities.shape[-1]
    ids = []
    for target in targets:
        if isinstance(target, int) or (isinstance(target, str) and target.lstrip("-").isdigit()):
            token = int(target)
            if not 0 <= token < vocab:
                raise GraphError(f"target token id {token} is outside the vocabulary (0..{vocab - 1})")
        else:
            encoded = lm.tokenizer(str(target), add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise GraphError(f"target {target!r} is {len(encoded)} tokens of the model's vocabulary, not one: "
                                 "give one token (or its id)")
            token = int(encoded[0])
        ids.append(token)
    return ids


def _unembedding(lm) -> tuple[torch.Tensor, float]:
    from interp.hooks.lm_sites import lm_sites

    sites = lm_sites(lm.model)
    _, head = sites.readout_modules()
    if len(head) != 1 or not isinstance(head[0], torch.nn.Linear):
        raise GraphError(f"{lm.name}'s output head is not one linear unembedding; graphs are not supported for it")
    return head[0].weight, sites.family.logit_scale(sites.config)


def attribute(lm, transcoders: dict[int, SAE], prompt: str | list[int], targets=None, *, max_n_logits: int = 10,
              desired_logit_prob: float = 0.95, batch_size: int = 32, zero_bos: bool = True, chat: bool = False,
              max_feature_nodes: int | None = None, model_name: str = "", scan: str = "") -> AttributionGraph:
    """The attribution graph of ``prompt`` (text, or token ids) for its next token.

    ``targets``: logit targets (token strings or ids); None: circuit-tracer's choice, the most probable tokens
    until their probabilities add up to ``desired_logit_prob`` (at most ``max_n_logits``). ``zero_bos``: no
    features at position 0 (the start token, which transcoders never see in training; its MLP output is an
    error node), as circuit-tracer does. ``max_feature_nodes``: at most this many feature nodes, visited in order of
    their running influence on the logits (circuit-tracer's option; the others are left out of the graph)."""
    if not 1 <= max_n_logits <= MAX_LOGITS:
        raise GraphError(f"max_n_logits must be in 1..{MAX_LOGITS}, got {max_n_logits}")
    if not 0 < desired_logit_prob <= 1:
        raise GraphError(f"desired_logit_prob must be in (0, 1], got {desired_logit_prob}")
    if not 1 <= batch_size <= MAX_BATCH:
        raise GraphError(f"batch_size must be in 1..{MAX_BATCH}, got {batch_size}")
    limit = MAX_FEATURE_NODES if max_feature_nodes is None else max_feature_nodes
    if not 1 <= limit <= MAX_FEATURE_NODES:
        raise GraphError(f"max_feature_nodes must be in 1..{MAX_FEATURE_NODES}, got {max_feature_nodes}")
    missing = [layer for layer in range(lm.n_layers) if layer not in transcoders]
    if missing:
        raise GraphError(f"no transcoder for layer(s) {', '.join(map(str, missing))} of {lm.n_layers}: the "
                         "replacement model needs one for every layer")
    for layer, tc in transcoders.items():
        if not tc.cfg.transcoder or tc.cfg.d_in != lm.d_model or tc.cfg.d_out != lm.d_model:
            raise GraphError(f"the transcoder of layer {layer} does not map d_model={lm.d_model} to itself: it was "
                             "trained on another model")
    if isinstance(prompt, str):
        ids = tokenize_prompt(lm, prompt, chat)
        text = prompt
    else:
        ids = [int(t) for t in prompt]
        if not ids or len(ids) > lm.n_ctx:
            raise GraphError(f"the prompt has {len(ids)} tokens; it needs 1..{lm.n_ctx} (the model's context)")
        text = lm.tokenizer.decode(ids) if lm.tokenizer is not None else ""
    vocab_size = lm.model.get_output_embeddings().weight.shape[0]
    if targets is not None:
        targets = list(targets)
        if not 1 <= len(targets) <= MAX_LOGITS:
            raise GraphError(f"give 1..{MAX_LOGITS} target tokens, got {len(targets)}")
        _target_ids(lm, targets, torch.zeros(vocab_size))  # refused here, before the forward pass
    unembed, logit_scale = _unembedding(lm)
    n_layers, n_pos = lm.n_layers, len(ids)
    device = next(lm.model.parameters()).device
    dtype = next(lm.model.parameters()).dtype
    cdt = torch.float64 if dtype == torch.float64 else torch.float32  # the graph's arithmetic

    from interp.hooks.lm_replace import replacement_pass

    state: dict[int, dict] = {}

    def replace(layer: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        tc = transcoders[layer]
        with torch.no_grad():
            acts = tc.encode(x[:1].to(cdt))[0]  # (P, d_sae): every row of the batch is the same prompt
            if zero_bos:
                acts[0] = 0
            recon = tc.decode(acts)
            skip_value = tc.skip_output(x[:1].to(cdt))
            if skip_value is not None:
                recon = recon + skip_value[0]
            error = y[0].to(cdt) - recon
        skip = tc.skip_output(x.to(cdt))
        anchor = (y.detach().to(cdt) - (skip.detach() if skip is not None else 0)).requires_grad_(True)
        state[layer] = {"acts": acts, "error": error, "anchor": anchor}
        out = anchor if skip is None else anchor + skip
        return out.to(y.dtype)

    rows_per_pass = batch_size
    input_ids = torch.tensor([ids] * rows_per_pass, device=device)
    lm.model.eval()
    with replacement_pass(lm, replace) as session:
        output = lm.model(input_ids=input_ids)
        session.check_frozen()
        logits = output.logits[0, -1].detach().to(cdt)
        embeddings = session.embeddings
        anchors = [state[layer]["anchor"] for layer in range(n_layers)]
        mlp_inputs = [session.mlp_inputs[layer] for layer in range(n_layers)]
        final = session.final
    with torch.no_grad():
        real = lm.model(input_ids=input_ids[:1]).logits[0, -1].to(cdt)
    drift = float((real - logits).abs().max())
    if drift > 1e-3 * (1 + float(real.abs().max())):
        raise GraphError(f"the replacement model's logits differ from the model's by {drift:.3g}: the frozen pass "
                         "does not reproduce this model's forward")
    probabilities = torch.softmax(logits, -1)
    if targets is None:
        top_p, top_idx = torch.topk(probabilities, min(max_n_logits, vocab_size))
        cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), torch.tensor(desired_logit_prob))) + 1
        target_ids = top_idx[:cutoff].tolist()
    else:
        target_ids = _target_ids(lm, targets, probabilities)
    n_logits = len(target_ids)
    demeaned = (unembed[target_ids].to(cdt) - unembed.to(cdt).mean(0, keepdim=True)) * logit_scale  # (n_logits, d)

    # ---- the nodes
    feature_rows = []
    for layer in range(n_layers):
        acts = state[layer]["acts"]
        pos, feat = acts.nonzero(as_tuple=True)
        feature_rows.append(torch.stack([torch.full_like(pos, layer), pos, feat], 1))
    features = torch.cat(feature_rows) if feature_rows else torch.zeros(0, 3, dtype=torch.long)
    n_features = len(features)
    if n_features > MAX_FEATURE_NODES:
        raise GraphError(f"the prompt has {n_features} active features, more than {MAX_FEATURE_NODES} (a dense graph "
                         "of them would not fit): give a shorter prompt, or --max-feature-nodes to visit the most "
                         "influential ones only")
    activations = torch.stack([state[int(l)]["acts"][int(p), int(f)] for l, p, f in features.tolist()]) \
        if n_features else torch.zeros(0, dtype=cdt)
    layer_slices, start = [], 0
    for layer in range(n_layers):
        count = int((features[:, 0] == layer).sum())
        layer_slices.append(slice(start, start + count))
        start += count
    decoder_vecs = [transcoders[layer].W_dec[features[layer_slices[layer], 2]].to(cdt)
                    * activations[layer_slices[layer], None] for layer in range(n_layers)]
    errors = torch.stack([state[layer]["error"] for layer in range(n_layers)])  # (L, P, d)
    token_vecs = embeddings[0].detach().to(cdt)  # (P, d)
    n_nodes = n_features + n_layers * n_pos + n_pos + n_logits
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=cdt)
    logit_start = n_nodes - n_logits

    def rows_for(targets_scalar: torch.Tensor, upto_layer: int, n_rows: int) -> torch.Tensor:
        """(n_rows, n_sources) direct effects of every source before ``upto_layer`` (n_layers: all)."""
        inputs = [embeddings] + anchors[:upto_layer]
        grads = torch.autograd.grad(targets_scalar, inputs, retain_graph=True, allow_unused=True)
        out = torch.zeros(n_rows, logit_start, dtype=cdt)
        g_embed = grads[0]
        if g_embed is not None:
            out[:, n_features + n_layers * n_pos:] = torch.einsum("bpd,pd->bp", g_embed[:n_rows].to(cdt), token_vecs)
        for layer in range(upto_layer):
            g = grads[1 + layer]
            if g is None:
                continue
            g = g[:n_rows].to(cdt)
            sl = layer_slices[layer]
            if sl.stop > sl.start:
                positions = features[sl, 1]
                out[:, sl] = torch.einsum("bnd,nd->bn", g[:, positions], decoder_vecs[layer])
            e0 = n_features + layer * n_pos
            out[:, e0:e0 + n_pos] = torch.einsum("bpd,pd->bp", g, errors[layer])
        return out

    # logit rows
    for start in range(0, n_logits, rows_per_pass):
        chunk = demeaned[start:start + rows_per_pass].to(final.dtype)
        n = len(chunk)
        scalar = (final[:n, -1, :] * chunk).sum()
        adjacency[logit_start + start:logit_start + start + n, :logit_start] = rows_for(scalar, n_layers, n)
    # feature rows, in batches of one layer each (sources: earlier layers only)
    feature_inputs = torch.zeros(n_features, dtype=cdt)

    def feature_rows(indices: torch.Tensor) -> None:
        for layer in indices_layers(indices):
            chosen = indices[features[indices, 0] == layer]
            tc = transcoders[layer]
            for start in range(0, len(chosen), rows_per_pass):
                idx = chosen[start:start + rows_per_pass]
                n = len(idx)
                encoders = tc.W_enc[:, features[idx, 2]].T.to(mlp_inputs[layer].dtype)  # (n, d)
                picked = mlp_inputs[layer][torch.arange(n), features[idx, 1]]  # (n, d)
                values = (picked * encoders).sum(-1)
                feature_inputs[idx] = values.detach().to(cdt)
                adjacency[idx] = torch.cat([rows_for(values.sum(), layer, n),
                                            torch.zeros(n, n_logits, dtype=cdt)], 1)

    def indices_layers(indices: torch.Tensor) -> list[int]:
        return sorted(set(features[indices, 0].tolist()))

    visited = torch.zeros(n_features, dtype=torch.bool)
    if n_features <= limit:
        feature_rows(torch.arange(n_features))
        visited[:] = True
    else:
        # circuit-tracer's max_feature_nodes: visit features in order of their influence on the logits through
        # the rows computed so far, a few batches at a time, until `limit` have rows; the rest are left out
        weights = torch.zeros(n_nodes, dtype=cdt)
        weights[logit_start:] = probabilities[target_ids].to(cdt)
        while int(visited.sum()) < limit:
            influence = total_influence(normalize_matrix(adjacency), weights)[:n_features]
            influence[visited] = -1
            take = min(4 * rows_per_pass, limit - int(visited.sum()))
            chosen = torch.argsort(influence, descending=True)[:take]
            feature_rows(chosen)
            visited[chosen] = True

    values = torch.zeros(n_nodes, dtype=cdt)
    values[:n_features] = activations
    values[n_features:n_features + n_layers * n_pos] = errors.norm(dim=-1).flatten()
    values[n_features + n_layers * n_pos:logit_start] = token_vecs.norm(dim=-1)
    values[logit_start:] = (logits[target_ids] - logits.mean()) if logit_scale == 1.0 else \
        torch.stack([(final[0, -1].to(cdt) * v.to(cdt)).sum() for v in demeaned]).detach()
    if not bool(visited.all()):
        keep = torch.cat([visited.nonzero().flatten(), torch.arange(n_features, n_nodes)])
        adjacency, values = adjacency[keep][:, keep], values[keep]
        features, activations, feature_inputs = features[visited], activations[visited], feature_inputs[visited]
    tokenizer = lm.tokenizer
    decode = (lambda t: tokenizer.decode([t])) if tokenizer is not None else str
    return AttributionGraph(
        prompt=text, tokens=ids, token_strings=[decode(t) for t in ids], n_layers=n_layers, features=features,
        activations=activations, logit_tokens=target_ids, logit_strings=[decode(t) for t in target_ids],
        logit_probabilities=probabilities[target_ids], adjacency=adjacency, values=values,
        feature_inputs=feature_inputs, model_name=model_name, scan=scan, error_norms=errors.norm(dim=-1),
        info={"dtype": str(dtype).removeprefix("torch."), "zero_bos": zero_bos, "n_active_features": n_features,
              "n_feature_nodes": int(visited.sum()),
              "replacement_logit_drift": drift})


# ----------------------------------------------------------------------------- pruning (circuit-tracer's equations)

def normalize_matrix(matrix: torch.Tensor) -> torch.Tensor:
    normalized = matrix.abs()
    return normalized / normalized.sum(dim=1, keepdim=True).clamp(min=1e-10)


def total_influence(normalized: torch.Tensor, weights: torch.Tensor, max_iterations: int = 1000) -> torch.Tensor:
    """weights @ (A + A^2 + ...) for a nilpotent A (a DAG's): the sum over every path length."""
    current = weights @ normalized
    influence = current.clone()
    for _ in range(max_iterations):
        current = current @ normalized
        if not current.any():
            return influence
        influence += current
    raise GraphError("influence did not converge: the adjacency matrix is not a DAG")


def _threshold(scores: torch.Tensor, keep: float) -> torch.Tensor:
    ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, 0) / ordered.sum().clamp_min(1e-30)
    index = min(int(torch.searchsorted(cumulative, torch.tensor(keep, dtype=cumulative.dtype))), len(ordered) - 1)
    return ordered[index]


@dataclass
class Pruned:
    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    cumulative_scores: torch.Tensor
    node_influence: torch.Tensor


def prune(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """circuit-tracer's pruning: keep the nodes carrying ``node_threshold`` of the influence on the logits (tokens
    and logits always), then the edges carrying ``edge_threshold`` of the influence in what is left, then drop
    nodes left without outgoing (features, errors) or incoming (features) edges until nothing changes."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise GraphError(f"{name} must be between 0 and 1, got {value}")
    A = graph.adjacency
    n_tokens, n_logits, n_features = graph.n_pos, len(graph.logit_tokens), graph.n_features
    weights = torch.zeros(A.shape[0])
    weights[-n_logits:] = graph.logit_probabilities
    node_influence = total_influence(normalize_matrix(A), weights)
    node_mask = node_influence >= _threshold(node_influence, node_threshold)
    node_mask[-n_logits - n_tokens:] = True
    pruned = A.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    normalized = normalize_matrix(pruned)
    edge_influence = total_influence(normalized, weights) + weights
    edge_scores = normalized * edge_influence[:, None]
    edge_mask = edge_scores >= _threshold(edge_scores.flatten(), edge_threshold)
    inner = slice(0, A.shape[0] - n_logits - n_tokens)
    previous = None
    while previous is None or not torch.equal(previous, node_mask):
        previous = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[inner] &= edge_mask[:, inner].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
    edge_mask[~node_mask] = False
    edge_mask[:, ~node_mask] = False
    order_scores, order = torch.sort(node_influence, descending=True)
    cumulative = torch.cumsum(order_scores, 0) / order_scores.sum().clamp_min(1e-30)
    scores = torch.zeros_like(node_influence)
    scores[order] = cumulative
    return Pruned(node_mask, edge_mask, scores, node_influence)


def graph_scores(graph: AttributionGraph) -> dict[str, float]:
    """circuit-tracer's replacement and completeness scores (how much flows through features, not errors)."""
    A = graph.adjacency
    weights = torch.zeros(A.shape[0])
    weights[-len(graph.logit_tokens):] = graph.logit_probabilities
    normalized = normalize_matrix(A)
    influence = total_influence(normalized, weights)
    errors = slice(graph.error_start, graph.token_start)
    tokens = slice(graph.token_start, graph.logit_start)
    token_influence, error_influence = influence[tokens].sum(), influence[errors].sum()
    replacement = float(token_influence / (token_influence + error_influence).clamp_min(1e-30))
    non_error = 1 - normalized[:, errors].sum(-1)
    output_influence = influence + weights
    completeness = float((non_error * output_influence).sum() / output_influence.sum().clamp_min(1e-30))
    return {"replacement_score": replacement, "completeness_score": completeness}


# ----------------------------------------------------------------------------- circuit-tracer's JSON

def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def node_records(graph: AttributionGraph, pruned: Pruned) -> dict[int, dict]:
    """circuit-tracer's frontend node records (frontend/graph_models.py: Node) of the kept nodes, by index."""
    nodes = {}
    for index in pruned.node_mask.nonzero().flatten().tolist():
        influence = float(pruned.cumulative_scores[index])
        if index < graph.n_features:
            layer, pos, feat = graph.features[index].tolist()
            nodes[index] = {"node_id": f"{layer}_{feat}_{pos}", "feature": _cantor(layer, feat), "layer": str(layer),
                            "ctx_idx": pos, "feature_type": "cross layer transcoder",
                            "jsNodeId": f"{layer}_{feat}-0", "influence": influence,
                            "activation": float(graph.activations[index])}
        elif index < graph.token_start:
            layer, pos = divmod(index - graph.error_start, graph.n_pos)
            nodes[index] = {"node_id": f"0_{layer}_{pos}", "feature": -1, "layer": str(layer), "ctx_idx": pos,
                            "feature_type": "mlp reconstruction error", "jsNodeId": f"{layer}_{pos}-0",
                            "influence": influence, "activation": None}
        elif index < graph.logit_start:
            pos = index - graph.token_start
            vocab = graph.tokens[pos]
            nodes[index] = {"node_id": f"E_{vocab}_{pos}", "feature": pos, "layer": "E", "ctx_idx": pos,
                            "feature_type": "embedding", "jsNodeId": f"E_{vocab}-{pos}", "influence": influence,
                            "activation": None}
        else:
            k = index - graph.logit_start
            vocab, prob = graph.logit_tokens[k], float(graph.logit_probabilities[k])
            layer = str(graph.n_layers + 1)
            nodes[index] = {"node_id": f"{layer}_{vocab}_{graph.n_pos - 1}", "feature": vocab, "layer": layer,
                            "ctx_idx": graph.n_pos - 1, "feature_type": "logit", "token_prob": prob,
                            "is_target_logit": k == 0, "jsNodeId": f"L_{vocab}-{graph.n_pos - 1}",
                            "clerp": f'Output "{graph.logit_strings[k]}" (p={prob:.3f})', "influence": None,
                            "activation": None}
    for record in nodes.values():
        record.setdefault("token_prob", 0.0)
        record.setdefault("is_target_logit", False)
        record.setdefault("clerp", "")
        record.update(run_idx=0, reverse_ctx_idx=0)
    return nodes


def graph_json(graph: AttributionGraph, slug: str, node_threshold: float = 0.8, edge_threshold: float = 0.98,
               pruned: Pruned | None = None) -> dict:
    """The graph in circuit-tracer's frontend JSON: {metadata, qParams, nodes, links} (pruned)."""
    pruned = pruned or prune(graph, node_threshold, edge_threshold)
    nodes = node_records(graph, pruned)
    targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": float(graph.adjacency[t, s])}
             for t, s in zip(targets.tolist(), sources.tolist()) if s in nodes and t in nodes]
    connected = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values() if n["node_id"] in connected or n["feature_type"] in ("embedding", "logit")]
    metadata = {"slug": slug, "scan": graph.scan or graph.model_name or "custom", "transcoder_list": [],
                "prompt_tokens": graph.token_strings, "prompt": graph.prompt, "node_threshold": node_threshold,
                "schema_version": 1,
                "info": {"model": graph.model_name, "generator": "interp-workbench saes.circuits",
                         "edge_threshold": edge_threshold, **graph.info, **graph_scores(graph)}}
    return {"metadata": metadata,
            "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""},
            "nodes": used, "links": links}


def write_graph_files(graph: AttributionGraph, out_dir: str | os.PathLike, slug: str,
                      node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Path:
    """``<out>/<slug>.json`` and ``<out>/graph-metadata.json`` (the frontend's list of graphs), as
    circuit-tracer's create_graph_files writes them; returns the graph file's path."""
    from interp.atomic import atomic_write_text

    from .strict_json import dumps

    if not slug or any(c in slug for c in "/\\") or slug.startswith("."):
        raise GraphError(f"slug {slug!r} must be a plain file name")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = graph_json(graph, slug, node_threshold, edge_threshold)
    path = out / f"{slug}.json"
    atomic_write_text(path, dumps(data, indent=1))
    listing = out / "graph-metadata.json"
    graphs = []
    if listing.is_file():
        try:
            graphs = [g for g in json.loads(listing.read_text()).get("graphs", []) if g.get("slug") != slug]
        except (json.JSONDecodeError, AttributeError):
            graphs = []
    graphs.append({k: data["metadata"][k] for k in ("slug", "scan", "prompt_tokens", "prompt", "node_threshold",
                                                    "schema_version")})
    atomic_write_text(listing, dumps({"graphs": graphs}, indent=1))
    return path


# ----------------------------------------------------------------------------- interventions

def predicted_effects(graph: AttributionGraph, nodes: list[int], scale: float = 0.0) -> torch.Tensor:
    """(n_logits,) the graph's linear prediction of each target logit's change when the feature nodes ``nodes``
    are set to ``scale`` times their activation (0: ablated), every other feature following linearly through the
    graph (its pre-activation changes by the sum of its incoming changes; it stays active), errors and tokens
    fixed. The features set by hand do not follow their inputs."""
    F = graph.n_features
    for node in nodes:
        if not 0 <= node < F:
            raise GraphError(f"node {node} is not a feature node (features are 0..{F - 1})")
    acts = graph.activations
    # per-unit-activation effects among features and onto logits
    per_unit = torch.where(acts != 0, 1.0 / acts.where(acts != 0, torch.ones_like(acts)), torch.zeros_like(acts))
    feature_to_feature = graph.adjacency[:F, :F] * per_unit[None, :]  # d pre_t / d a_s
    feature_to_logit = graph.adjacency[graph.logit_start:, :F] * per_unit[None, :]
    fixed = torch.zeros(F, dtype=torch.bool)
    fixed[nodes] = True
    delta = torch.zeros(F, dtype=acts.dtype)
    delta[nodes] = (scale - 1.0) * acts[nodes]
    # features in order (layer, position): each free feature's change is the sum of its inputs' changes
    order = sorted(range(F), key=lambda i: (int(graph.features[i, 0]), int(graph.features[i, 1])))
    for i in order:
        if not fixed[i]:
            delta[i] = feature_to_feature[i] @ delta
    return feature_to_logit @ delta


def real_effects(lm, graph: AttributionGraph, transcoders: dict[int, SAE], nodes: list[int],
                 scale: float = 0.0) -> torch.Tensor:
    """(n_logits,) the real model's change of each target's demeaned logit when the feature nodes ``nodes`` have
    their decoder contribution scaled to ``scale`` times (0: removed) in the MLP output of their layer and position;
    attention, norms and every MLP downstream are the real model's."""
    from interp.hooks.lm_replace import MLPOutputEdit

    by_layer: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for node in nodes:
        if not 0 <= node < graph.n_features:
            raise GraphError(f"node {node} is not a feature node (features are 0..{graph.n_features - 1})")
        layer, pos, feat = graph.features[node].tolist()
        change = (scale - 1.0) * graph.activations[node] * transcoders[layer].W_dec[feat].double()
        by_layer.setdefault(layer, []).append((pos, change))

    def editor(changes):
        def edit(x, y):
            y = y.clone()
            for pos, change in changes:
                y[:, pos] += change.to(y.dtype)
            return y
        return edit

    ids = torch.tensor([graph.tokens], device=next(lm.model.parameters()).device)
    with torch.no_grad(), MLPOutputEdit(lm, {layer: editor(c) for layer, c in by_layer.items()}):
        edited = lm.model(input_ids=ids).logits[0, -1].double()
    with torch.no_grad():
        clean = lm.model(input_ids=ids).logits[0, -1].double()
    targets = graph.logit_tokens
    return (edited[targets] - edited.mean()) - (clean[targets] - clean.mean())


def replacement_fidelity(lm, transcoders: dict[int, SAE], sequences: list[list[int]], batch_size: int = 8) -> dict:
    """The replacement model's next-token fidelity with every MLP replaced by its transcoder at positions 1..
    (the start token keeps its MLP, as in training): CE of the clean model, the replaced one and one with every
    MLP's output zeroed there; CE recovered = (CE_zero - CE_replaced) / (CE_zero - CE_clean); KL(clean || replaced).
    Predictions at positions 1 .. n - 2 are scored (as `saes.lm_eval.splice_losses`)."""
    from interp.hooks.lm import right_padded
    from interp.hooks.lm_replace import MLPOutputEdit

    if not sequences:
        raise GraphError("no sequence of at least 3 tokens to score")
    missing = [layer for layer in range(lm.n_layers) if layer not in transcoders]
    if missing:
        raise GraphError(f"no transcoder for layer(s) {', '.join(map(str, missing))}")

    def replaced(tc):
        def edit(x, y):
            out = tc(x.float()).to(y.dtype)
            return torch.cat([y[:, :1], out[:, 1:]], 1)
        return edit

    def zeroed(x, y):
        return torch.cat([y[:, :1], torch.zeros_like(y[:, 1:])], 1)

    sums = {"ce_clean": 0.0, "ce_replaced": 0.0, "ce_zero": 0.0, "kl_replaced": 0.0, "kl_zero": 0.0}
    n_scored = 0
    sequences = sorted(sequences, key=len)
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start:start + batch_size]
        ids, mask = right_padded(lm, chunk)
        scored = torch.cat([torch.zeros(len(chunk), 1, dtype=torch.bool), mask[:, 2:].bool()], 1)
        targets = ids[:, 1:]

        def logprobs():
            return lm.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float().log_softmax(-1)

        with torch.no_grad():
            clean = logprobs()
            with MLPOutputEdit(lm, {layer: replaced(transcoders[layer]) for layer in range(lm.n_layers)}):
                repl = logprobs()
            with MLPOutputEdit(lm, {layer: zeroed for layer in range(lm.n_layers)}):
                zero = logprobs()
        for name, logp in (("clean", clean), ("replaced", repl), ("zero", zero)):
            sums[f"ce_{name}"] += float(-logp.gather(-1, targets[..., None])[..., 0][scored].double().sum())
        for name, logp in (("replaced", repl), ("zero", zero)):
            sums[f"kl_{name}"] += float((clean.exp() * (clean - logp)).sum(-1)[scored].double().sum())
        n_scored += int(scored.sum())
    means = {k: v / n_scored for k, v in sums.items()}
    gap = means["ce_zero"] - means["ce_clean"]
    return {"scored_tokens": n_scored, "sequences": len(sequences), "ce_loss_clean": means["ce_clean"],
            "ce_loss_replaced": means["ce_replaced"], "ce_loss_mlps_zeroed": means["ce_zero"],
            "ce_recovered": (means["ce_zero"] - means["ce_replaced"]) / gap if abs(gap) > 1e-12 else None,
            "kl_clean_replaced": means["kl_replaced"], "kl_clean_mlps_zeroed": means["kl_zero"],
            "replaced": "every layer's MLP output at positions 1.. (the start token keeps its MLP)"}


def top_feature_nodes(graph: AttributionGraph, n: int, pruned: Pruned | None = None) -> list[int]:
    """The ``n`` feature nodes of most influence on the logits (circuit-tracer's node influence)."""
    pruned = pruned or prune(graph)
    influence = pruned.node_influence[:graph.n_features]
    return torch.argsort(influence, descending=True)[:n].tolist()


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values):
        t = torch.tensor(values, dtype=torch.float64)
        order = torch.argsort(t)
        r = torch.empty_like(t)
        r[order] = torch.arange(len(t), dtype=torch.float64)
        for v in torch.unique(t):  # ties: their average rank
            m = t == v
            r[m] = r[m].mean()
        return r
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator else float("nan")


__all__ = ["AttributionGraph", "GraphError", "Pruned", "attribute", "graph_json", "graph_scores",
           "load_transcoders", "normalize_matrix", "predicted_effects", "prune", "real_effects", "replacement_fidelity", "spearman",
           "tokenize_prompt", "top_feature_nodes", "total_influence", "write_graph_files"]


# ----------------------------------------------------------------------------- command lines

def add_graph_arguments(parser) -> None:
    """`saes graph`: a prompt's attribution graph, written in circuit-tracer's JSON."""
    from interp.cli import add_dtype_argument, at_least

    parser.add_argument("--model", required=True, help="e.g. toy-chat")
    parser.add_argument("--transcoders", required=True, help="a directory with one transcoder per layer "
                        "(blocks.L.mlp.hook_in/), e.g. saes/pretrained/toy-chat-transcoders")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--chat", action="store_true", help="render the prompt in the model's chat template")
    parser.add_argument("--target", action="append", default=None, metavar="TOKEN",
                        help="a target logit (token or id; repeatable); default: the likeliest tokens to 0.95")
    parser.add_argument("--max-logits", type=at_least(1), default=10)
    parser.add_argument("--node-threshold", type=float, default=0.8)
    parser.add_argument("--edge-threshold", type=float, default=0.98)
    parser.add_argument("--batch-size", type=at_least(1), default=32, help="targets per backward pass")
    parser.add_argument("--max-feature-nodes", type=at_least(1), default=None,
                        help="visit at most this many features, most influential first (circuit-tracer's option)")
    parser.add_argument("--ablate-top", type=int, default=0, metavar="N",
                        help="also ablate the N most influential features one at a time: the real model's logit "
                             "change beside the graph's prediction")
    add_out_argument(parser, required=True, help="output directory (<slug>.json + graph-metadata.json)")
    parser.add_argument("--slug", default="graph")
    parser.add_argument("--threads", type=at_least(1), default=1)
    add_dtype_argument(parser)


def graph_command(args) -> int:
    from interp.cli import LM_DTYPE, parse_dtype
    from interp.models.lm import load_lm

    for name in ("node_threshold", "edge_threshold"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise GraphError(f"--{name.replace('_', '-')} must be between 0 and 1")
    if not 0 <= args.ablate_top <= 100:
        raise GraphError("--ablate-top must be in 0..100")
    if not args.slug or any(c in args.slug for c in "/\\") or args.slug.startswith("."):
        raise GraphError(f"--slug {args.slug!r} must be a plain file name")
    torch.set_num_threads(args.threads)
    lm = load_lm(args.model, dtype=parse_dtype(args.dtype, default=LM_DTYPE))
    transcoders = load_transcoders(args.transcoders, lm, model_name=args.model)
    graph = attribute(lm, transcoders, args.prompt, args.target, max_n_logits=args.max_logits,
                      batch_size=args.batch_size, chat=args.chat, model_name=args.model,
                      max_feature_nodes=args.max_feature_nodes,
                      scan=Path(args.transcoders).name)
    path = write_graph_files(graph, args.out, args.slug, args.node_threshold, args.edge_threshold)
    pruned = prune(graph, args.node_threshold, args.edge_threshold)
    scores = graph_scores(graph)
    print(f"wrote {path}: {graph.n_features} active features, {int(pruned.node_mask.sum())} nodes and "
          f"{int(pruned.edge_mask.sum())} edges kept; replacement score {scores['replacement_score']:.3f}, "
          f"completeness {scores['completeness_score']:.3f}")
    print("targets: " + ", ".join(f"{s!r} p={float(p):.3f}" for s, p in zip(graph.logit_strings,
                                                                          graph.logit_probabilities)))
    if args.ablate_top:
        print(f"ablating one feature at a time; change of the demeaned logit of {graph.logit_strings[0]!r}:")
        print("| node | layer | position | feature | activation | predicted | real |\n|---|---|---|---|---|---|---|")
        for node in top_feature_nodes(graph, args.ablate_top, pruned):
            layer, pos, feat = graph.features[node].tolist()
            predicted = float(predicted_effects(graph, [node])[0])
            real = float(real_effects(lm, graph, transcoders, [node])[0])
            print(f"| {node} | {layer} | {pos} ({graph.token_strings[pos]!r}) | {feat} | "
                  f"{float(graph.activations[node]):.3f} | {predicted:+.4f} | {real:+.4f} |")
    return 0


def add_fidelity_arguments(parser) -> None:
    """`saes transcoder-eval`: the replacement model's next-token fidelity on held-out text."""
    from interp.cli import add_dtype_argument, at_least

    parser.add_argument("--model", required=True)
    parser.add_argument("--transcoders", required=True)
    parser.add_argument("--text", required=True, help="held-out text (JSONL or lines)")
    parser.add_argument("--tokens", type=at_least(1), default=20000, help="scored tokens (at most)")
    parser.add_argument("--context", type=at_least(3), default=128)
    add_out_argument(parser, required=True, help="fidelity JSON")
    parser.add_argument("--threads", type=at_least(1), default=1)
    add_dtype_argument(parser)


def fidelity_command(args) -> int:
    from interp.cli import LM_DTYPE, parse_dtype
    from interp.lm_text import read_documents, token_sequences
    from interp.models.lm import load_lm

    from .lm_eval import scored_sequences
    from .strict_json import dumps, write_json

    torch.set_num_threads(args.threads)
    documents = read_documents(args.text)
    lm = load_lm(args.model, dtype=parse_dtype(args.dtype, default=LM_DTYPE))
    transcoders = load_transcoders(args.transcoders, lm, model_name=args.model)
    sequences = scored_sequences(token_sequences(lm.tokenizer, documents, min(args.context, lm.n_ctx)), args.tokens)
    result = {"model": args.model, "transcoders": str(args.transcoders), "text": str(args.text),
              **replacement_fidelity(lm, transcoders, sequences)}
    result["per_layer"] = {str(layer): {k: tc.cfg.metadata.get(k) for k in ("trained_tokens",)}
                           for layer, tc in transcoders.items()}
    write_json(args.out, result, indent=2)
    print(dumps({k: v for k, v in result.items() if k != "per_layer"}, indent=1))
    return 0
