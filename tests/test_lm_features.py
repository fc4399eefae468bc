"""Feature cards of an SAE on toy-chat's residual stream over a text corpus (saes/lm_features.py,
`python -m saes features --text`). The SAE is test_lm_steer's, trained there in a few seconds."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import pytest
import torch

from test_lm_steer import HOOK, ROOT, toy_lm, toy_lm_sae  # noqa: I001 (tests/ is on the path)

from interp.hooks.lm import capture_residuals
from interp.hooks.lm_steer import logit_effects
from saes.lm_features import LMAnalysisConfig, analyse_lm_sae, card_html, load_lm_cards, tokenize_corpus


def _corpus(directory: Path) -> Path:
    """Held-out chat-world conversations in Dolly's fields (context empty, as many Dolly records have it)."""
    from zoo.chat.world import World

    examples = World().mixture("held_out", 60, {"general": 0.5, "benign": 0.25, "harmful": 0.25}, seed=1)
    path = directory / "corpus.jsonl"
    path.write_text("".join(json.dumps({"instruction": e["prompt"], "context": "", "response": e["completion"]}) + "\n"
                            for e in examples))
    return path


@functools.cache
def _cards() -> tuple[dict, Path, Path]:
    """(features.json payload, output directory, corpus): the CLI run once on the trained SAE."""
    from saes.__main__ import main

    work = Path(tempfile.mkdtemp(prefix="lm-features-"))
    corpus = _corpus(work)
    out = work / "cards"
    assert main(["features", "--sae", str(toy_lm_sae()[1]), "--text", str(corpus), "--tokens", "900",
                 "--max-length", "48", "--out", str(out)]) == 0  # no --model: the SAE's metadata names toy-chat
    return json.loads((out / "features.json").read_text()), out, corpus


def _dense_latents(payload: dict, corpus: Path) -> tuple[list[list[int]], torch.Tensor]:
    """(the sequences analysed, every feature's activation at every position: (sequences, width, F)), by brute force."""
    from interp.lm_text import read_documents

    lm, sae = toy_lm(), toy_lm_sae()[0]
    sequences = tokenize_corpus(lm.tokenizer, read_documents(corpus), payload["config"]["tokens"],
                                payload["config"]["max_length"])
    width = max(map(len, sequences))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    latents = sae.encode(capture_residuals(lm, ids, mask, [HOOK])[HOOK])
    return sequences, latents * mask[..., None]


def test_cards_are_written_as_strict_json_and_a_self_contained_page():
    payload, out, _ = _cards()
    assert payload["kind"] == "lm" and payload["hook"] == HOOK and payload["model"] == "toy-chat"
    assert payload["corpus"]["tokens"] == 900 and payload["corpus"]["path"] == "corpus.jsonl"
    assert payload["config"]["max_length"] == 48 and payload["corpus"]["sequences"] >= 900 // 48
    assert len(payload["features"]) == 256 and [c["id"] for c in payload["features"]] == list(range(256))
    html = (out / "features.html").read_text()
    assert html.startswith("<!doctype html>") and "<script" not in html and "http" not in html
    assert "background:rgba(255,140,0," in html and "class='tok top'" in html and "&lt;s&gt;" in html
    assert load_lm_cards(out)["hook"] == HOOK


def test_frequency_mean_max_and_histogram_are_those_of_the_corpus_tokens_after_the_start_token():
    payload, _, corpus = _cards()
    sequences, latents = _dense_latents(payload, corpus)
    counted = latents[:, 1:]  # the start token's position is left out
    n_tokens = sum(len(s) - 1 for s in sequences)
    assert payload["corpus"]["counted_tokens"] == n_tokens
    firing = (counted > 0).sum(dim=(0, 1))
    for card in payload["features"]:
        f = card["id"]
        assert card["n_firing"] == int(firing[f])
        assert card["frequency"] == pytest.approx(int(firing[f]) / n_tokens, abs=1e-6)
        assert sum(card["histogram"]["counts"]) == card["n_firing"]
        if card["n_firing"]:
            values = counted[..., f][counted[..., f] > 0]
            assert card["mean_activation"] == pytest.approx(float(values.mean()), rel=1e-3, abs=1e-3)
            assert card["max_activation"] == pytest.approx(float(values.max()), rel=1e-4, abs=1e-3)
            assert card["histogram"]["edges"][-1] == pytest.approx(card["max_activation"], abs=1e-3)
    assert sum(c["n_firing"] > 0 for c in payload["features"]) > 100


def test_top_contexts_are_the_sequences_where_a_feature_peaks_with_every_tokens_activation():
    payload, _, corpus = _cards()
    sequences, latents = _dense_latents(payload, corpus)
    lm = toy_lm()
    peaks = latents[:, 1:].amax(dim=1)  # (sequences, F): each sequence's largest activation, start token left out
    checked = 0
    for card in payload["features"]:
        f, contexts = card["id"], card["top_contexts"]
        assert len({c["sequence"] for c in contexts}) == len(contexts) <= 6
        if not card["n_firing"]:
            assert contexts == []
            continue
        values = [c["activation"] for c in contexts]
        assert values == sorted(values, reverse=True) and values[0] == pytest.approx(card["max_activation"], abs=1e-3)
        best = peaks[:, f].topk(len(contexts)).values
        torch.testing.assert_close(torch.tensor(values), best, atol=1e-3, rtol=1e-4)
        for c in contexts:
            seq = sequences[c["sequence"]]
            window = latents[c["sequence"], c["start"]:c["start"] + len(c["tokens"]), f].clone()
            if c["start"] == 0:
                window[0] = 0  # the start token is left out: shown silent
            torch.testing.assert_close(torch.tensor(c["activations"]), window, atol=1e-3, rtol=1e-4)
            assert c["activations"][c["highlight"]] == c["activation"]
            assert c["start"] + c["highlight"] == c["position"]
            assert "".join(c["tokens"]) == lm.tokenizer.decode(seq[c["start"]:c["start"] + len(c["tokens"])])
            checked += 1
    assert checked > 300


def test_promoted_and_suppressed_tokens_are_the_extremes_of_the_decoder_direction_through_the_unembedding():
    payload, _, _ = _cards()
    lm, sae = toy_lm(), toy_lm_sae()[0]
    effects = logit_effects(lm, sae.W_dec)
    for card in payload["features"][:40]:
        effect = effects[card["id"]]
        assert [t["id"] for t in card["promoted"]] == effect.topk(10).indices.tolist()
        assert [t["id"] for t in card["suppressed"]] == effect.topk(10, largest=False).indices.tolist()
        assert card["promoted"][0]["logit"] == pytest.approx(float(effect.max()), abs=1e-3)
        assert card["promoted"][0]["token"] == lm.tokenizer.decode([card["promoted"][0]["id"]])
    # The effect is ln_f's scale times the centred direction, read by W_U (the toy's head is tied to its embedding).
    w = sae.W_dec[7] - sae.W_dec[7].mean()
    expected = lm.model.lm_head.weight @ (lm.model.transformer.ln_f.weight * w)
    torch.testing.assert_close(effects[7], expected.detach(), atol=1e-4, rtol=1e-4)


def test_a_plain_text_corpus_works_and_a_card_renders_alone(tmp_path):
    lm, (sae, _) = toy_lm(), toy_lm_sae()
    corpus = tmp_path / "lines.txt"
    corpus.write_text("What colour is the sky?\n\nSay these words backwards: apple river\n")
    payload = analyse_lm_sae(lm, sae, corpus, tmp_path / "out", LMAnalysisConfig(tokens=100))
    assert payload["corpus"]["documents"] == 2 and payload["corpus"]["tokens"] < 100
    card = next(c for c in payload["features"] if c["n_firing"])
    fragment = card_html(card)
    assert fragment.startswith("<div class='card'") and "promotes:" in fragment and "suppresses:" in fragment


def _run(capsys, *args: str) -> tuple[int, list[str]]:
    """(exit status, stderr lines) of `python -m saes features ARGS`, run in this process."""
    from saes.__main__ import main

    capsys.readouterr()
    status = main(["features", *args])
    err = capsys.readouterr().err
    return status, [line for line in err.strip().splitlines() if not line.startswith("Loading weights")]


def test_bad_requests_are_one_line_errors_before_anything_is_written(tmp_path, capsys):
    from saes.sae import SAE, SAEConfig

    _, _, corpus = _cards()
    sae_dir = str(toy_lm_sae()[1])
    SAE(SAEConfig("topk", 64, 32, k=4, metadata={"hook_name": HOOK, "model_name": "toy-chat"})).save(tmp_path / "narrow")
    SAE(SAEConfig("topk", 64, 32, k=4, metadata={"hook_name": "mid_block.attentions.0"})).save(tmp_path / "unet")
    (tmp_path / "empty.jsonl").write_text("\n")
    shipped = ROOT / "saes" / "pretrained" / "lm-test-never-written"
    for args, message in [
            (["--sae", str(tmp_path / "narrow"), "--text", str(corpus)], "reads 64 dimensions"),
            (["--sae", str(tmp_path / "unet"), "--text", str(corpus)], "not an SAE on a language-model residual hook"),
            (["--sae", sae_dir, "--world", "4"], "give --text FILE"),
            (["--sae", sae_dir, "--text", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "x")], "no text"),
            (["--sae", sae_dir, "--text", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x")], "missing.txt"),
            (["--sae", sae_dir, "--text", str(corpus), "--model", "toy-chatt"], "did you mean toy-chat"),
            (["--sae", sae_dir, "--text", str(corpus), "--out", str(shipped)], "shipped with the repository")]:
        status, lines = _run(capsys, *args)
        assert status == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, lines)
    assert not shipped.exists() and not (tmp_path / "x").exists()
    assert not (Path(sae_dir) / "features.json").exists()  # every run above had --out elsewhere or failed first


def test_an_image_sae_still_needs_out_and_an_image_source(capsys):
    status, lines = _run(capsys, "--sae", str(ROOT / "saes" / "pretrained" / "toy"), "--world", "2")
    assert status == 2 and lines == ["error: give --out DIR, where features.html and features_summary.json go"]


def test_every_features_top_contexts_at_once_equal_the_feature_by_feature_search():
    """The search over all features at once against the feature-by-feature one it replaced
    (`benchmarks.export.per_feature_top_contexts`). Sparse activations with ties (equal values in one sequence and across sequences), features firing in one
    sequence, in many, never; windows cut at both ends of their sequence."""
    import numpy as np

    from benchmarks.export import per_feature_top_contexts
    from saes.lm_features import Activations, feature_cards

    rng = np.random.default_rng(0)
    lm = toy_lm()
    vocab = len(lm.tokenizer)
    sequences = [[1] + rng.integers(3, vocab, size=int(n)).tolist() for n in rng.integers(2, 40, size=30)]
    starts = np.concatenate([[0], np.cumsum([len(s) for s in sequences])])
    F, nnz = 50, 900
    rows = rng.integers(0, starts[-1], size=3 * nnz)
    feats = rng.integers(0, F - 5, size=3 * nnz)                     # the last 5 features never fire
    _, unique = np.unique(rows * F + feats, return_index=True)
    rows, feats = rows[unique][:nnz], feats[unique][:nnz]
    values = rng.choice([0.5, 1.0, 1.5, 2.0], size=len(rows)) + (rng.random(len(rows)) < 0.5) * rng.random(len(rows))
    shuffle = rng.permutation(len(rows))
    acts = Activations(sequences, starts, rows[shuffle], feats[shuffle].astype(np.int64), values[shuffle],
                       int(starts[-1]), F)
    logits = tuple(np.zeros((F, 2), dtype=d) for d in (np.int64, np.float32, np.int64, np.float32))
    for top in (2, 20):
        config = LMAnalysisConfig(n_top_contexts=top, window_before=5, window_after=3)
        cards = feature_cards(acts, lm.tokenizer, logits, config)
        assert [c["top_contexts"] for c in cards] == per_feature_top_contexts(acts, lm.tokenizer, config)
    assert sum(len(c["top_contexts"]) > 3 for c in cards) > 10 and not cards[-1]["top_contexts"]


def test_window_pieces_decoded_at_once_equal_the_token_by_token_pieces():
    """`PieceDecoder` against `sequence_pieces`: SmolLM2's byte-level tokenizer on text with characters split
    across tokens and a special token and the toy word-level one (which joins words with spaces)."""
    from saes.lm_features import PieceDecoder, sequence_pieces

    toy = toy_lm().tokenizer
    ids = toy("the cat sat on the mat")["input_ids"]
    assert PieceDecoder(toy)(ids) == sequence_pieces(toy, ids)
    from transformers import AutoTokenizer

    from interp.models.fetch import fetched_dir, is_fetched

    if not is_fetched(fetched_dir("smollm2-135m-instruct")):
        pytest.skip("SmolLM2 is not fetched (python -m interp fetch smollm2-135m-instruct)")
    smol = AutoTokenizer.from_pretrained(fetched_dir("smollm2-135m-instruct"))
    text = ("When did Virgin Australia start operating?\n\nVirgin Australia commenced services on 31 August 2000 as "
            "Virgin Blue, with two aircraft on a single route.  Tabs\tand  double spaces; a naïve café in Zürich, "
            "Ελληνικά, русский, 東京タワー, 한국어, emoji 🙂👍🏽 and math ∑∫√ — quotes “like this” … <|im_end|> "
            "def f(x):\n    return x ** 2  # code\n") * 2
    tokens = smol(text)["input_ids"]
    decoder, split, n = PieceDecoder(smol), 0, 0
    for n, lo in enumerate(range(0, len(tokens) - 17, 3), 1):
        window = tokens[lo:lo + 17]
        assert decoder(window) == sequence_pieces(smol, window)
        split += any("\ufffd" in smol.decode([i]) for i in window)
    assert 0 < split < n  # some windows hold a character split across tokens (the token-by-token path), some not
