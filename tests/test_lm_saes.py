"""SAEs on language-model residual streams (toy-chat): collect -> store -> train -> sae-lens / TransformerLens -> eval."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from interp.__main__ import main as interp_main
from interp.hooks.lm import capture_residuals
from interp.hooks.lm_splice import residual_replacement
from interp.lm_text import TextError, read_documents, token_sequences
from interp.store import ActivationStore, StoreError
from saes.__main__ import main as saes_main
from saes.lm_eval import scored_sequences, splice_losses
from saes.sae import SAE, SAEConfig

HOOK = "blocks.2.hook_resid_post"


def _corpus(path: Path, n: int, split: str = "train", seed: int = 1) -> Path:
    """n examples of the chat world as prompt/completion JSONL (the toy's own vocabulary)."""
    from zoo.chat.world import World

    examples = World().mixture(split, n, {"general": 0.6, "benign": 0.2, "harmful": 0.2}, seed=seed)
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    return path


@pytest.fixture(scope="module")
def lm():
    from interp.models.lm import load_lm

    return load_lm("toy-chat")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("text") / "train.jsonl", 400)


@pytest.fixture(scope="module")
def store(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm-store") / "store"
    assert interp_main(["collect", "--model", "toy-chat", "--hooks", HOOK, "blocks.0.hook_resid_pre", "--text",
                        str(corpus), "--max-tokens", "3000", "--tokens-per-shard", "1000", "--batch-size", "7",
                        "--context", "24", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def trained_sae(store, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lm-sae") / "sae"
    assert saes_main(["train", "--store", str(store), "--block", HOOK, "--out", str(out), "--d-sae", "256",
                      "--k", "8", "--batch-size", "250", "--tokens", "6000", "--lr", "1e-3", "--threads", "1"]) == 0
    return out


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


# ----------------------------------------------------------------------------- text

def test_documents_come_from_dolly_text_and_prompt_completion_records_and_plain_lines(tmp_path):
    dolly = tmp_path / "d.jsonl"
    dolly.write_text(json.dumps({"instruction": "Name a colour.", "context": "", "response": "Red."}) + "\n\n"
                     + json.dumps({"text": "plain record"}) + "\n"
                     + json.dumps({"prompt": "Q?", "completion": "A."}) + "\n")
    assert read_documents(dolly) == ["Name a colour.\n\nRed.", "plain record", "Q?\n\nA."]
    plain = tmp_path / "p.txt"
    plain.write_text("first doc\n\n  second doc  \n")
    assert read_documents(plain) == ["first doc", "second doc"]
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"question": "?"}) + "\n")
    with pytest.raises(TextError, match="line 1.*question"):
        read_documents(bad)


def test_sequences_start_with_one_start_token_and_long_documents_are_cut(lm):
    start = lm.tokenizer("x")["input_ids"][0]
    long_doc = " ".join(["needle kettle"] * 30)
    sequences = token_sequences(lm.tokenizer, [long_doc, "kettle"], context=10)
    body = lm.tokenizer(long_doc, add_special_tokens=False)["input_ids"]
    assert all(s[0] == start and len(s) <= 10 for s in sequences)
    assert [t for s in sequences[:-1] for t in s[1:]] == body  # the long document, cut but complete
    assert sequences[-1][1:] == lm.tokenizer("kettle", add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------- collection

def test_store_holds_the_residuals_of_every_token_but_the_start_token_and_no_padding(store, corpus, lm):
    s = ActivationStore(store)
    assert s.kind == "lm" and len(s) == s.n_tokens == 3000 and len(s.shards) == 3
    assert s.channels(HOOK) == lm.d_model == 128 and s.n_vectors(HOOK) == 3000
    table = s.token_table()
    assert torch.equal(table["token_index"], torch.arange(3000))
    assert int(table["position"].min()) == 1  # the start token is never stored
    sequences = token_sequences(lm.tokenizer, read_documents(corpus), 24)
    vectors = torch.cat(list(s.batches(HOOK, batch_size=512, shuffle=False)))
    for i in (0, 5, int(table["sequence"][-1])):  # each sequence alone, unpadded, against the store's rows
        rows = table["sequence"] == i
        seq = sequences[i]
        positions = table["position"][rows]
        assert torch.equal(table["token_id"][rows], torch.tensor(seq)[positions])
        if i != int(table["sequence"][-1]):  # the last one is cut by --max-tokens
            assert positions.tolist() == list(range(1, len(seq)))
        alone = capture_residuals(lm, torch.tensor([seq]), names=[HOOK])[HOOK][0]
        torch.testing.assert_close(vectors[rows], alone[positions].half().float(), rtol=0, atol=2e-3)
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["shapes"] == {HOOK: [128], "blocks.0.hook_resid_pre": [128]}
    for entry in manifest["shards"]:
        path = store / entry["file"]
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        tensors = load_file(str(path))
        assert tensors[HOOK].dtype == torch.float16 and set(entry["sha256"]) == set(tensors)


def test_collection_resumes_writing_only_the_missing_shard(store, corpus, tmp_path, monkeypatch):
    import shutil

    import interp.collect_lm as collect_module

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    (copy / "manifest.json").unlink()
    (copy / "shards" / "shard-000001.safetensors").unlink()
    written = []
    real = collect_module._lm_shard
    monkeypatch.setattr(collect_module, "_lm_shard", lambda *a: written.append(a[-1]) or real(*a))
    assert interp_main(["collect", "--model", "toy-chat", "--hooks", HOOK, "blocks.0.hook_resid_pre", "--text",
                        str(corpus), "--max-tokens", "3000", "--tokens-per-shard", "1000", "--batch-size", "7",
                        "--context", "24", "--out", str(copy)]) == 0
    assert written == [1]
    # the same bytes as the uninterrupted run: the manifest's digests of the rewritten shard match
    assert json.loads((copy / "manifest.json").read_text()) == json.loads((store / "manifest.json").read_text())


def test_collection_refuses_to_resume_a_store_of_other_settings(store, corpus, capsys):
    assert interp_main(["collect", "--model", "toy-chat", "--hooks", HOOK, "blocks.0.hook_resid_pre", "--text",
                        str(corpus), "--max-tokens", "2000", "--tokens-per-shard", "1000", "--context", "24",
                        "--out", str(store)]) == 2
    assert "n_tokens" in _one_line_error(capsys)


@pytest.mark.parametrize("case", ["hook", "empty", "binary", "latin1", "few", "json"])
def test_bad_collection_input_is_one_line_error(case, tmp_path, capsys):
    text = _corpus(tmp_path / "t.jsonl", 20)
    hooks = [HOOK]
    extra = []
    if case == "hook":
        hooks = ["blocks.7.hook_resid_post"]
    elif case == "empty":
        text = tmp_path / "empty.txt"
        text.write_text("\n  \n")
    elif case == "binary":
        text = tmp_path / "weights.bin"
        text.write_bytes(b"\x00\x01\x02abc")
    elif case == "latin1":
        text = tmp_path / "latin1.txt"
        text.write_bytes("caf\xe9 au lait".encode("latin-1"))
    elif case == "few":
        extra = ["--max-tokens", "100000"]
    elif case == "json":
        text = tmp_path / "broken.jsonl"
        text.write_text('{"text": "fine"}\n{"text": \n')
    code = interp_main(["collect", "--model", "toy-chat", "--hooks", *hooks, "--text", str(text), *extra,
                        "--out", str(tmp_path / "out")])
    assert code == 2
    message = _one_line_error(capsys)
    expected = {"hook": "blocks.7.hook_resid_post.*blocks.0.hook_resid_pre, blocks.3.hook_resid_post",
                "empty": "empty.txt holds no text", "binary": "weights.bin is a binary file",
                "latin1": "latin1.txt is not UTF-8.*0xe9 at offset 3", "few": r"has \d+ tokens.*--allow-fewer",
                "json": "broken.jsonl line 2 is not JSON"}[case]
    import re

    assert re.search(expected, message), message
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_allow_fewer_collects_what_the_corpus_has_with_a_note(tmp_path, capsys):
    text = _corpus(tmp_path / "t.jsonl", 10)
    assert interp_main(["collect", "--model", "toy-chat", "--hooks", HOOK, "--text", str(text), "--max-tokens",
                        "100000", "--allow-fewer", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    n = ActivationStore(tmp_path / "out").n_tokens
    assert 0 < n < 100000 and f"note: {text} " in err and f"collecting all {n:,}" in err


def test_hooks_command_lists_the_models_residual_hook_names(capsys):
    assert interp_main(["hooks", "--model", "toy-chat"]) == 0
    names = capsys.readouterr().out.split()
    assert len(names) == 12 and names[0] == "blocks.0.hook_resid_pre" and names[-1] == "blocks.3.hook_resid_post"
    assert interp_main(["blocks", "--model", "toy-chat"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["d_model"] == 128 and described["kind"] == "lm" and described["sites"] == names
    assert interp_main(["hooks", "--model", "toy"]) == 0
    t2i_names = capsys.readouterr().out.split()
    assert interp_main(["blocks", "--model", "toy"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["kind"] == "t2i" and described["sites"] == t2i_names == list(described["blocks"])

# ----------------------------------------------------------------------------- training, sae-lens, TransformerLens

def test_sae_trained_on_an_lm_store_loads_in_sae_lens_and_attaches_to_a_hooked_transformer(trained_sae, lm):
    import sae_lens
    from sae_lens import HookedSAETransformer

    from interp.models.lm import load_lm

    lens = sae_lens.SAE.load_from_disk(str(trained_sae))
    assert lens.cfg.metadata.hook_name == HOOK and lens.cfg.metadata.model_name == "toy-chat"
    assert lens.cfg.d_in == 128 and lens.cfg.metadata.context_size == 24
    tl = load_lm(lens.cfg.metadata.model_name, backend="transformer_lens")
    hooked = HookedSAETransformer(tl.model.cfg, tokenizer=tl.tokenizer, move_to_device=False)
    hooked.load_state_dict(tl.model.state_dict())
    hooked.add_sae(lens)
    assert list(hooked.acts_to_saes) == [HOOK]
    ids = torch.tensor([lm.tokenizer("Say these words backwards: needle kettle")["input_ids"]])
    ours = SAE.load(trained_sae)
    with torch.no_grad():
        attached = hooked(ids)
        by_hand = tl.model.run_with_hooks(ids, fwd_hooks=[(HOOK, lambda act, hook: lens(act))])
        with residual_replacement(lm, HOOK, ours, start=0):  # our HF splice, every position
            spliced_hf = lm.model(ids).logits
        clean = lm.model(ids).logits
    torch.testing.assert_close(attached, by_hand, rtol=0, atol=1e-4)
    torch.testing.assert_close(attached, spliced_hf, rtol=0, atol=1e-4)
    assert (attached - clean).abs().max() > 0.1  # the SAE really is in the forward pass


@pytest.mark.parametrize("architecture", ["batchtopk", "standard"])
def test_sae_lens_architectures_train_on_an_lm_store_and_keep_its_hook(architecture, store, tmp_path):
    import sae_lens

    out = tmp_path / architecture
    assert saes_main(["train", "--store", str(store), "--block", HOOK, "--out", str(out), "--architecture",
                      architecture, "--d-sae", "128", "--k", "8", "--batch-size", "500", "--tokens", "1500",
                      "--threads", "1"]) == 0
    lens = sae_lens.SAE.load_from_disk(str(out))
    assert (lens.cfg.metadata.hook_name, lens.cfg.metadata.model_name, lens.cfg.d_in) == (HOOK, "toy-chat", 128)
    x = next(ActivationStore(store).batches(HOOK, batch_size=64, shuffle=False))
    with torch.no_grad():
        torch.testing.assert_close(SAE.load(out)(x), lens(x), rtol=1e-4, atol=1e-4)


def test_replacement_hooks_match_transformer_lens_and_never_stay_registered(lm):
    from interp.models.lm import load_lm

    tl = load_lm("toy-chat", backend="transformer_lens")
    ids = torch.tensor([lm.tokenizer("Which is the biggest of 17 36 94?")["input_ids"]])
    fn = lambda x: 0.5 * x.flip(-1)  # noqa: E731 - not affine per position, so no LayerNorm hides it
    with torch.no_grad():
        clean = lm.model(ids).logits
        for name in ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.2.hook_resid_post"):
            with residual_replacement(lm, name, fn):
                hf = lm.model(ids).logits
            with residual_replacement(tl, name, fn):
                hooked = tl.model(ids)
            torch.testing.assert_close(hf, hooked, rtol=0, atol=1e-4)
            torch.testing.assert_close(hf[:, 0], clean[:, 0])  # position 0 (start token) is left alone
            assert (hf[:, 1:] - clean[:, 1:]).abs().max() > 0.1
        with pytest.raises(RuntimeError, match="boom"):
            with residual_replacement(lm, HOOK, fn):
                raise RuntimeError("boom")
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in lm.model.modules())
    assert not any(m._forward_hooks for m in tl.model.modules())
    torch.testing.assert_close(lm.model(ids).logits, clean)


# ----------------------------------------------------------------------------- evaluation

def _identity_sae(d: int) -> SAE:
    """A standard SAE that reconstructs exactly: relu(x) - relu(-x) = x."""
    sae = SAE(SAEConfig(architecture="standard", d_in=d, d_sae=2 * d, metadata={"hook_name": HOOK,
                                                                                 "model_name": "toy-chat"}))
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=0))
    return sae


def test_identity_sae_recovers_all_the_loss_and_zero_ablation_recovers_none(lm, tmp_path):
    sequences = scored_sequences(token_sequences(lm.tokenizer, read_documents(_corpus(tmp_path / "h.jsonl", 30,
                                                                                      "held_out")), 32), 200)
    assert sum(len(s) - 2 for s in sequences) == 200
    metrics, residuals = splice_losses(lm, _identity_sae(128), HOOK, sequences, batch_size=4)
    assert metrics["scored_tokens"] == 200
    assert metrics["ce_loss_spliced"] == pytest.approx(metrics["ce_loss_clean"], abs=1e-4)
    assert metrics["kl_clean_spliced"] == pytest.approx(0, abs=1e-4)
    assert metrics["loss_recovered"] == pytest.approx(1, abs=1e-3)
    assert metrics["ce_loss_zero"] > metrics["ce_loss_clean"] + 0.5 and metrics["kl_clean_zero"] > 0.5
    assert sum(len(r) for r in residuals) == sum(len(s) - 1 for s in sequences)
    # an SAE that writes nothing is the zero ablation plus its decoder bias 0: it recovers nothing
    nothing = _identity_sae(128)
    with torch.no_grad():
        nothing.W_dec.zero_()
    zero_like, _ = splice_losses(lm, nothing, HOOK, sequences, batch_size=4)
    assert zero_like["loss_recovered"] == pytest.approx(0, abs=1e-3)


def test_eval_cli_writes_splice_loss_on_held_out_text_into_strict_json(trained_sae, store, tmp_path, capsys):
    held_out = _corpus(tmp_path / "held.jsonl", 40, "held_out", seed=3)
    out = tmp_path / "eval.json"
    assert saes_main(["eval", "--sae", str(trained_sae), "--store", str(store), "--model", "toy-chat", "--text",
                      str(held_out), "--tokens", "300", "--context", "24", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    splice = result["lm_splice"]
    assert result["tokens"] == 3000 and result["explained_variance"] > 0.3  # from the store
    assert splice["scored_tokens"] == 300 and splice["hook"] == HOOK
    recovered = (splice["ce_loss_zero"] - splice["ce_loss_spliced"]) / (splice["ce_loss_zero"] - splice["ce_loss_clean"])
    assert splice["loss_recovered"] == pytest.approx(recovered)
    assert splice["kl_clean_spliced"] > 0 and "loss recovered" in printed and "KL(clean‖spliced)" in printed
    assert out.with_suffix(".md").read_text() in printed


def test_eval_refuses_an_sae_that_does_not_fit_the_model(tmp_path, capsys):
    text = _corpus(tmp_path / "h.jsonl", 5, "held_out")
    wide = _identity_sae(96)
    wide.save(tmp_path / "wide")
    assert saes_main(["eval", "--sae", str(tmp_path / "wide"), "--model", "toy-chat", "--text", str(text)]) == 2
    assert "d_in=96" in _one_line_error(capsys)
    elsewhere = _identity_sae(128)
    elsewhere.cfg.metadata["hook_name"] = "blocks.9.hook_resid_post"
    elsewhere.save(tmp_path / "elsewhere")
    assert saes_main(["eval", "--sae", str(tmp_path / "elsewhere"), "--model", "toy-chat", "--text", str(text)]) == 2
    assert "blocks.9.hook_resid_post" in (message := _one_line_error(capsys)) and "valid names" in message
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert saes_main(["eval", "--sae", str(tmp_path / "wide"), "--model", "toy-chat", "--text", str(empty)]) == 2
    assert "empty.jsonl holds no text" in _one_line_error(capsys)


def test_store_of_tokens_refuses_image_access(store):
    with pytest.raises(StoreError, match="not images"):
        ActivationStore(store).image(0, HOOK)
