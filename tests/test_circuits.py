"""Transcoders (sae-lens 6 format both ways, training) and attribution graphs (exactness, bad input, pruning and
JSON against circuit-tracer 0.5.0's own code where it is installed)."""

from __future__ import annotations

import json

import pytest
import torch

from flowlens.tiny import tiny_gpt2, tiny_llama, word_level_tokenizer
from interp.hooks.lm import language_model
from saes.circuits import (GraphError, attribute, graph_json, load_transcoders, predicted_effects, prune,
                           real_effects, replacement_effects, write_graph_files)
from saes.sae import SAE, SAEConfig

TEXT = "the cat sat on the mat and the dog ran to the door"


def _random_transcoder(d, d_sae=48, architecture="topk", skip=False, seed=0, biases=True, dtype="float32"):
    torch.manual_seed(seed)
    tc = SAE(SAEConfig(architecture, d, d_sae, k=6 if architecture == "topk" else None, transcoder=True, skip=skip,
                       dtype=dtype, metadata={"model_name": "tiny"}))
    with torch.no_grad():
        tc.W_enc.normal_(0, 0.5)
        tc.W_dec.normal_(0, 0.1)
        if biases:
            tc.b_enc.normal_(0, 0.1)
        if skip:
            tc.W_skip.normal_(0, 0.05)
        if architecture == "jumprelu":
            tc.threshold.fill_(0.2)
    return tc


def _tiny(model):
    tokenizer = word_level_tokenizer([TEXT, "sat door"])
    lm = language_model(model)
    lm.tokenizer = tokenizer
    return lm


# ----------------------------------------------------------------------------- transcoder format

@pytest.mark.parametrize("architecture,skip", [("jumprelu", False), ("jumprelu", True), ("standard", True)])
def test_transcoder_saves_for_sae_lens_and_loads_its_own(tmp_path, architecture, skip):
    from sae_lens import SAE as LensSAE

    ours = _random_transcoder(16, 32, architecture, skip=skip)
    with torch.no_grad():
        ours.b_dec.normal_()
    ours.save(tmp_path / "ours")
    lens = LensSAE.load_from_disk(str(tmp_path / "ours"))
    assert type(lens).__name__ == {("jumprelu", False): "JumpReLUTranscoder", ("jumprelu", True):
                                   "JumpReLUSkipTranscoder", ("standard", True): "SkipTranscoder"}[(architecture, skip)]
    x = torch.randn(20, 16)
    assert torch.allclose(lens(x), ours(x), atol=1e-6)
    assert torch.allclose(lens.encode(x), ours.encode(x), atol=1e-6)
    # the reverse: sae-lens' own save, loaded here
    with torch.no_grad():
        for p in lens.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    lens.save_model(str(tmp_path / "lens"))
    back = SAE.load(tmp_path / "lens")
    assert back.cfg.transcoder and back.cfg.skip == skip and back.cfg.architecture == architecture
    assert torch.allclose(back(x), lens(x), atol=1e-6)


def test_topk_transcoder_trains_on_pairs(tmp_path):
    from saes.train import TrainConfig, train

    torch.manual_seed(0)
    W1, W2 = torch.randn(12, 40), torch.randn(40, 10) / 6

    def batches():
        while True:
            x = torch.randn(256, 12)
            yield torch.cat([x, (x @ W1).relu() @ W2], 1)

    for architecture in ("topk-transcoder", "batchtopk-transcoder"):
        config = TrainConfig(architecture=architecture, d_in=12, d_out=10, d_sae=64, k=8, batch_size=256, lr=3e-3,
                             total_tokens=256 * 150, log_every_steps=50, checkpoint_every_steps=1000,
                             options={"skip": True}, metadata={"hook_name": "blocks.0.mlp.hook_in"})
        tc = train(config, batches(), tmp_path / architecture, progress=False)
        x = torch.randn(2000, 12)
        y = (x @ W1).relu() @ W2
        ev = 1 - (tc(x) - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
        assert ev > 0.7, (architecture, float(ev))
        loaded = SAE.load(tmp_path / architecture)
        assert loaded.cfg.transcoder and loaded.cfg.d_out == 10
        assert torch.allclose(loaded(x), tc(x), atol=1e-5)
    with pytest.raises(ValueError, match="target"):
        TrainConfig(architecture="topk-transcoder", d_in=12, d_sae=64, k=8).validate()
        from saes.trainers import make_trainer
        make_trainer(TrainConfig(architecture="topk-transcoder", d_in=12, d_sae=64, k=8))


def test_mlp_sites_capture_the_mlp_input_and_output():
    from interp.hooks.lm import capture_residuals

    lm = _tiny(tiny_gpt2(40, layers=2))
    ids = torch.tensor([[2, 5, 6, 7]])
    acts = capture_residuals(lm, ids, names=["blocks.1.mlp.hook_in", "blocks.1.mlp.hook_out",
                                             "blocks.1.hook_resid_mid"])
    block = lm.model.transformer.h[1]
    expected_in = block.ln_2(acts["blocks.1.hook_resid_mid"])
    assert torch.allclose(acts["blocks.1.mlp.hook_in"], expected_in, atol=1e-6)
    assert torch.allclose(acts["blocks.1.mlp.hook_out"], block.mlp(expected_in), atol=1e-6)


# ----------------------------------------------------------------------------- exactness

def test_graph_is_complete_on_a_model_without_biases():
    """Every logit (demeaned) and every feature's pre-activation is the sum of its direct effects: embeddings,
    features and error nodes, in the frozen-attention replacement model (no biases: nothing else adds)."""
    lm = _tiny(tiny_llama(40, hidden_size=32, layers=3).double())
    tcs = {layer: _random_transcoder(32, seed=layer, biases=False, dtype="float64") for layer in range(3)}
    graph = attribute(lm, tcs, TEXT, batch_size=16)
    assert graph.n_features > 50 and len(graph.logit_tokens) >= 1
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([graph.tokens])).logits[0, -1].double()
    expected = logits[graph.logit_tokens] - logits.mean()
    rows = graph.adjacency[graph.logit_start:]
    assert torch.allclose(rows.sum(1), expected, atol=1e-4)
    assert torch.allclose(graph.adjacency[:graph.n_features].sum(1), graph.feature_inputs, atol=1e-4)
    # errors matter here (random transcoders): without their columns the sums no longer add up
    errors = rows[:, graph.error_start:graph.token_start].sum(1)
    assert errors.abs().max() > 1e-2
    # features only receive from earlier layers; logits receive nothing from logits
    layers = graph.features[:, 0]
    feature_block = graph.adjacency[:graph.n_features, :graph.n_features]
    assert not feature_block[layers[:, None] <= layers[None, :]].any()


def test_max_feature_nodes_keeps_the_most_influential_features_rows_unchanged():
    lm = _tiny(tiny_llama(40, hidden_size=32, layers=3).double())
    tcs = {layer: _random_transcoder(32, seed=layer, biases=False, dtype="float64") for layer in range(3)}
    full = attribute(lm, tcs, TEXT, batch_size=8)
    part = attribute(lm, tcs, TEXT, batch_size=8, max_feature_nodes=full.n_features // 3)
    assert part.n_features == full.n_features // 3 and part.info["n_active_features"] == full.n_features
    rows = {tuple(f): i for i, f in enumerate(full.features.tolist())}
    kept = torch.tensor([rows[tuple(f)] for f in part.features.tolist()])
    columns = torch.cat([kept, torch.arange(full.n_features, full.adjacency.shape[0])])
    # the logit rows and the visited features' rows are the full graph's, on the kept sources
    assert torch.allclose(part.adjacency[part.logit_start:], full.adjacency[full.logit_start:][:, columns])
    assert torch.allclose(part.adjacency[:part.n_features], full.adjacency[kept][:, columns])
    # the first features visited are those of most direct influence on the logits
    direct = full.adjacency[full.logit_start:, :full.n_features].abs().T @ full.logit_probabilities.double()
    assert int(direct.argmax()) in kept.tolist()


def test_perfect_transcoder_leaves_error_nodes_zero():
    """A ReLU GPT-2 MLP is exactly a ReLU transcoder (W_enc = c_fc, W_dec = c_proj): every error node is zero and
    the graph's logits are the model's."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_embd=24, n_layer=2, n_head=4, n_positions=64, activation_function="relu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    lm = _tiny(GPT2LMHeadModel(config).eval())
    tcs = {}
    for layer, block in enumerate(lm.model.transformer.h):
        tc = SAE(SAEConfig("standard", 24, 96, transcoder=True))
        with torch.no_grad():
            tc.W_enc.copy_(block.mlp.c_fc.weight)
            tc.b_enc.copy_(block.mlp.c_fc.bias)
            tc.W_dec.copy_(block.mlp.c_proj.weight)
            tc.b_dec.copy_(block.mlp.c_proj.bias)
        tcs[layer] = tc
    graph = attribute(lm, tcs, TEXT, zero_bos=False)
    assert graph.error_norms.abs().max() < 1e-4
    error_columns = graph.adjacency[:, graph.error_start:graph.token_start]
    assert error_columns.abs().max() < 1e-4
    assert graph.n_features > 0


# ----------------------------------------------------------------------------- bad input

def test_bad_graph_requests_get_one_clear_line(tmp_path):
    lm = _tiny(tiny_llama(40, hidden_size=32, layers=2, max_positions=16))
    tcs = {layer: _random_transcoder(32, seed=layer) for layer in range(2)}
    with pytest.raises(GraphError, match=r"no transcoder for layer\(s\) 1 of 2"):
        attribute(lm, {0: tcs[0]}, TEXT)
    with pytest.raises(GraphError, match="outside the vocabulary"):
        attribute(lm, tcs, TEXT, targets=[40])
    with pytest.raises(GraphError, match="past the model's context of 16"):
        attribute(lm, tcs, " ".join([TEXT] * 3))
    other = {layer: _random_transcoder(24, seed=layer) for layer in range(2)}
    with pytest.raises(GraphError, match="trained on another model"):
        attribute(lm, other, TEXT)
    for layer, tc in tcs.items():
        tc.cfg.metadata["hook_name"] = f"blocks.{layer}.mlp.hook_in"
        tc.save(tmp_path / "set" / f"blocks.{layer}.mlp.hook_in")
    assert sorted(load_transcoders(tmp_path / "set", lm, model_name="tiny")) == [0, 1]
    with pytest.raises(GraphError, match="trained on tiny, not on toy-chat"):
        load_transcoders(tmp_path / "set", lm, model_name="toy-chat")
    (tmp_path / "set" / "blocks.1.mlp.hook_in" / "cfg.json").unlink()
    with pytest.raises(GraphError, match=r"no transcoder for layer\(s\) 1"):
        load_transcoders(tmp_path / "set", lm)


# ----------------------------------------------------------------------------- pruning, JSON, interventions

def test_pruning_and_json_match_circuit_tracer(tmp_path):
    lm = _tiny(tiny_llama(40, hidden_size=32, layers=3))
    tcs = {layer: _random_transcoder(32, seed=layer) for layer in range(3)}
    graph = attribute(lm, tcs, TEXT, batch_size=16, scan="tiny-transcoders")
    ours = prune(graph)
    path = write_graph_files(graph, tmp_path, "tiny")
    data = json.loads(path.read_text())
    assert {"metadata", "qParams", "nodes", "links"} <= set(data)
    assert {n["feature_type"] for n in data["nodes"]} >= {"embedding", "logit"}
    assert json.loads((tmp_path / "graph-metadata.json").read_text())["graphs"][0]["slug"] == "tiny"
    ct = pytest.importorskip("circuit_tracer.graph")
    from circuit_tracer.frontend.graph_models import Model

    Model(**data)  # circuit-tracer's own schema of the frontend's file
    theirs = ct.prune_graph(type("G", (), {"adjacency_matrix": graph.adjacency, "input_tokens": graph.tokens,
                                          "logit_targets": graph.logit_tokens,
                                          "selected_features": torch.arange(graph.n_features),
                                          "logit_probabilities": graph.logit_probabilities})())
    assert torch.equal(ours.node_mask, theirs.node_mask)
    assert torch.equal(ours.edge_mask, theirs.edge_mask)
    assert torch.allclose(ours.cumulative_scores, theirs.cumulative_scores)


def test_intervention_real_and_predicted_for_a_last_layer_feature():
    """A feature of the last layer at the last position writes straight into the final norm: the real model's
    change is the readout of the edited stream (checked against ln_f and the head applied by hand), and the graph's
    prediction is the same edit through the norm with its scale frozen (computed here from the norm's formula)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from interp.hooks.lm import capture_residuals

    torch.manual_seed(1)
    config = GPT2Config(vocab_size=40, n_embd=24, n_layer=2, n_head=4, n_positions=64, activation_function="relu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    lm = _tiny(GPT2LMHeadModel(config).eval().double())
    tcs = {}
    for layer, block in enumerate(lm.model.transformer.h):
        tc = SAE(SAEConfig("standard", 24, 96, transcoder=True, dtype="float64"))
        with torch.no_grad():
            tc.W_enc.copy_(block.mlp.c_fc.weight)
            tc.b_enc.copy_(block.mlp.c_fc.bias)
            tc.W_dec.copy_(block.mlp.c_proj.weight)
            tc.b_dec.copy_(block.mlp.c_proj.bias)
        tcs[layer] = tc
    graph = attribute(lm, tcs, TEXT, zero_bos=False)
    node = next(i for i in range(graph.n_features) if graph.features[i, 0] == 1
                and graph.features[i, 1] == graph.n_pos - 1)
    _, _, feat = graph.features[node].tolist()
    change = -0.5 * graph.activations[node] * tcs[1].W_dec[feat]
    h = capture_residuals(lm, torch.tensor([graph.tokens]), names=["blocks.1.hook_resid_post"])[
        "blocks.1.hook_resid_post"][0, -1].double()
    ln, W_U = lm.model.transformer.ln_f, lm.model.lm_head.weight.double()

    def demeaned(logits):
        return logits[graph.logit_tokens] - logits.mean()

    with torch.no_grad():
        expected_real = demeaned(W_U @ ln(h + change)) - demeaned(W_U @ ln(h))
        sigma = (h - h.mean()).pow(2).mean().add(ln.eps).sqrt()
        expected_linear = demeaned(W_U @ (ln.weight * (change - change.mean()) / sigma))
    real = real_effects(lm, graph, tcs, [node], scale=0.5)
    predicted = predicted_effects(graph, [node], scale=0.5)
    assert torch.allclose(real, expected_real, atol=1e-9)
    assert torch.allclose(predicted.double(), expected_linear, atol=1e-9)
    assert (predicted.sign() == real.sign()).float().mean() >= 0.5  # the same edit, seen linearly and for real
    # these transcoders are the MLPs themselves: the replacement model run forward is the real model, for a feature
    # of the last layer and for one of the first (whose change reaches the logits through the second MLP)
    first = next(i for i in range(graph.n_features) if graph.features[i, 0] == 0)
    for n in (node, first):
        assert torch.allclose(replacement_effects(lm, graph, tcs, [n], scale=0.5),
                              real_effects(lm, graph, tcs, [n], scale=0.5), atol=1e-9)
    assert torch.count_nonzero(replacement_effects(lm, graph, tcs, [])) == 0
    with pytest.raises(GraphError, match="not a feature node"):
        predicted_effects(graph, [graph.n_features])


def test_graph_command_on_the_shipped_toy_chat_transcoders(tmp_path, capsys):
    """The command line end to end on the embedded chat model: the sort example's answer is the target, the JSON
    is written, and a bad request is one `error:` line with nothing written."""
    from saes.__main__ import main

    root = "saes/pretrained/toy-chat-transcoders"
    assert main(["graph", "--model", "toy-chat", "--transcoders", root, "--prompt", "Sort: 84 48 7", "--chat",
                 "--out", str(tmp_path / "g"), "--slug", "sort", "--ablate-top", "2"]) == 0
    data = json.loads((tmp_path / "g" / "sort.json").read_text())
    logits = [n for n in data["nodes"] if n["feature_type"] == "logit"]
    assert logits[0]["is_target_logit"] and '"7"' in logits[0]["clerp"]
    assert "| node | layer |" in capsys.readouterr().out
    for argv, message in ((["--target", "99999"], "outside the vocabulary"),
                          (["--node-threshold", "1.5"], "between 0 and 1"),
                          (["--prompt", " ".join(["7"] * 200)], "past the model's context")):
        args = ["graph", "--model", "toy-chat", "--transcoders", root, "--prompt", "Sort: 84 48 7",
                "--out", str(tmp_path / "bad")] + argv
        assert main(args) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]  # (besides transformers' bar)
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
        assert not (tmp_path / "bad").exists()


def test_transcoder_set_trains_every_layer_and_resumes_to_the_same_weights(tmp_path):
    """`saes train-transcoders`' loop: one transcoder per layer from one forward pass per chunk; a run stopped
    after its first chunk and resumed ends with the same weights as one that never stopped, and the set loads as
    a graph's transcoders."""
    from saes.transcoder_set import TranscoderSetConfig, train_transcoder_set

    lm = _tiny(tiny_llama(40, hidden_size=16, layers=2))
    ids = lm.tokenizer(TEXT)["input_ids"]
    sequences = [[2] + ids[i:] + ids[:i] for i in range(8)]  # 8 sequences of 13 trained tokens each
    config = dict(d_sae=32, k=4, batch_size=16, chunk_tokens=26, epochs=2, dead_after_tokens=40)
    straight = train_transcoder_set(lm, sequences, tmp_path / "a", TranscoderSetConfig(total_tokens=104, **config),
                                    model_name="tiny", log=lambda line: None)
    assert sorted(straight) == [0, 1]
    train_transcoder_set(lm, sequences, tmp_path / "b", TranscoderSetConfig(total_tokens=26, **config),
                         model_name="tiny", log=lambda line: None)  # stops after the first chunk
    resumed = train_transcoder_set(lm, sequences, tmp_path / "b", TranscoderSetConfig(total_tokens=104, **config),
                                   model_name="tiny", log=lambda line: None)
    for layer in (0, 1):
        a, b = SAE.load(straight[layer]), SAE.load(resumed[layer])
        assert a.cfg.metadata["hook_name"] == f"blocks.{layer}.mlp.hook_in"
        for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    loaded = load_transcoders(tmp_path / "a", lm, model_name="tiny")
    assert sorted(loaded) == [0, 1]
    # thresholds calibrated so that k = 4 features fire per token on average on these tokens
    from saes.transcoder_set import _mlp_rows, calibrate_thresholds

    calibrate_thresholds(lm, loaded, sequences, k=4)
    rows = _mlp_rows(lm, sequences, [0, 1])
    for layer in (0, 1):
        l0 = (loaded[layer].encode(rows[layer][:, :16]) > 0).sum(-1).float().mean()
        assert 4 - 1 / len(rows[layer]) - 1e-6 <= float(l0) <= 4 + 1e-6
    with pytest.raises(ValueError, match="other settings"):
        train_transcoder_set(lm, sequences, tmp_path / "a", TranscoderSetConfig(total_tokens=104, **{**config, "k": 5}),
                             model_name="tiny", log=lambda line: None)
    # a size no memory holds is refused before anything is allocated or written
    with pytest.raises(ValueError, match="need at least .* of memory to train side by side"):
        train_transcoder_set(lm, sequences, tmp_path / "huge", TranscoderSetConfig(
            total_tokens=104, **{**config, "d_sae": 10**12}), model_name="tiny", log=lambda line: None)
    assert not (tmp_path / "huge").exists()
