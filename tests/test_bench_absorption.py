"""SAEBench's feature absorption eval (saes/bench/absorption.py) on the toy chat model's shipped SAE, and its parity
with SAEBench 0.6.0's own functions (requirements-anchors.txt; installed with --no-deps) on the same SAE, residuals
and probes: agreement within 1e-4 relative.

SAEBench's run_eval (evals/absorption/main.py) does not import on this stack (its sae_selection_utils needs
`tabulate`, which is not installed), so its `_aggregate_results_df` is read from the installed file and run by
itself; every other function is imported and called as SAEBench ships it."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from saes.bench import absorption as ab
from saes.sae import SAE

ROOT = Path(__file__).resolve().parents[1]
TOY_SAE = ROOT / "saes/pretrained/toy-chat/blocks.1.hook_resid_post"
HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def toy():
    from interp.models.lm import load_lm

    torch.set_num_threads(1)
    lm = load_lm("toy-chat")
    sae = SAE.load(TOY_SAE, dtype="float32")
    vocab = ab.alpha_vocab(lm.tokenizer)
    return lm, sae, vocab


@pytest.fixture(scope="module")
def data(toy):
    """Every toy word once as a train prompt and once as a test prompt (every letter in both, as SAEBench's code
    needs: a letter with no train word gives it a division by zero, one with no test word an undefined AUC)."""
    lm, sae, vocab = toy
    rng = random.Random(0)
    template = ab.AbsorptionConfig().prompt_template
    words = [w for letter in ab.LETTERS for w in [v for v in vocab if ab.first_letter(v).strip().lower() == letter][:6]]
    train = [ab.icl_prompt(w, vocab, template, rng) for w in words]
    test = [ab.icl_prompt(w, vocab, template, rng) for w in words]
    x_train = ab.residuals_at(lm, HOOK, [p.base for p in train], -6, 64)
    x_test = ab.residuals_at(lm, HOOK, [p.base for p in test], -6, 64)
    y_train = torch.tensor([p.label for p in train])
    y_test = torch.tensor([p.label for p in test])
    return words, x_train, y_train, x_test, y_test


def close(a, b, rtol=1e-4, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=rtol, atol=atol)


class SAEBenchSAE:
    """The attributes of a sae_lens SAE that SAEBench's absorption functions read, over the project's SAE."""

    def __init__(self, sae):
        self.sae, self.cfg = sae, sae.cfg
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.W_enc, self.W_dec = sae.W_enc, sae.W_dec

    def encode(self, x):
        return self.sae.encode(x)


class SAEBenchModel:
    """HookedTransformer's run_with_cache / to_tokens over the project's LM (start token prepended, as TL's
    prepend_bos): SAEBench's calculator reads the residual through it."""

    def __init__(self, lm):
        self.lm, self.tokenizer = lm, lm.tokenizer

    def to_tokens(self, text):
        return torch.tensor([ab.prompt_ids(self.lm, text)])

    def run_with_cache(self, texts, names_filter):
        from interp.hooks.lm import capture_residuals, right_padded

        ids, mask = right_padded(self.lm, [ab.prompt_ids(self.lm, t) for t in texts])
        return None, capture_residuals(self.lm, ids, mask, names=list(names_filter))


# ----------------------------------------------------------------------------- the method's pieces


def test_vocab_and_prompts_follow_saebench(toy):
    from sae_bench.evals.absorption.prompting import create_icl_prompt, first_letter_formatter
    from sae_bench.evals.absorption.vocab import get_alpha_tokens

    lm, _, vocab = toy
    assert sorted(vocab) == sorted(get_alpha_tokens(lm.tokenizer))
    random.seed(5)
    theirs = [create_icl_prompt(w, examples=vocab, base_template="{word} has the first letter:",
                                answer_formatter=first_letter_formatter(), max_icl_examples=10,
                                prepend_separator_to_first_example=True) for w in vocab[:50]]
    rng = random.Random(5)
    ours = [ab.icl_prompt(w, vocab, "{word} has the first letter:", rng) for w in vocab[:50]]
    assert [p.base for p in ours] == [p.base for p in theirs]
    assert [ab.LETTERS[p.label] for p in ours] == [p.answer.strip().lower() for p in theirs]
    # the word's token is at -6 of every prompt (the template's tail is 5 tokens on this tokenizer)
    ids = ab.prompt_ids(lm, ours[0].base)
    assert ids[-6] == lm.tokenizer(ours[0].word, add_special_tokens=False)["input_ids"][0]


def test_probe_training_matches_saebench(data):
    from sae_bench.evals.absorption.probing import train_multi_probe

    _, x_train, y_train, _, _ = data
    onehot = torch.nn.functional.one_hot(y_train, num_classes=26)
    torch.manual_seed(3)
    theirs = train_multi_probe(x_train, onehot, num_probes=26, batch_size=64, num_epochs=4, lr=1e-2,
                               weight_decay=1e-4, show_progress=False, device=torch.device("cpu"))
    torch.manual_seed(3)
    ours = ab.train_probe(x_train, onehot, batch_size=64, epochs=4, lr=1e-2, weight_decay=1e-4)
    close(ours.weights.detach(), theirs.weights.detach())
    close(ours.fc.bias.detach(), theirs.biases.detach())


def test_k_sparse_probes_and_split_latents_match_saebench(toy, data):
    from sae_bench.evals.absorption.k_sparse_probing import (
        KSparseProbe, add_feature_splits_to_metrics_df, build_metrics_df, eval_probe_and_sae_k_sparse_raw_scores,
        sae_k_sparse_metadata, train_k_sparse_probes)

    _, sae, _ = toy
    vocab, x_train, y_train, x_test, y_test = data
    ks = [1, 2]
    labels = [(w, int(y)) for w, y in zip(vocab, y_train)]
    torch.manual_seed(11)
    theirs = train_k_sparse_probes(SAEBenchSAE(sae), labels, x_train, ks=ks, l1_decay=0.01, batch_size=4096,
                                   num_epochs=6, precalc_sae_acts=True)
    torch.manual_seed(11)
    ours = ab.train_k_sparse_probes(sae, x_train, y_train, ks, l1_decay=0.01, batch_size=4096, epochs=6,
                                    latents=ab.encode(sae, x_train))
    for k in ks:
        for letter in range(26):
            assert ours[k][letter].feature_ids.tolist() == theirs[k][letter].feature_ids.tolist()
            close(ours[k][letter].weight, theirs[k][letter].weight)
            close(ours[k][letter].bias, theirs[k][letter].bias.item())

    # F1s on the test words and the split latents, from SAEBench's metrics table, with our probes in it
    torch.manual_seed(0)
    probe = ab.train_probe(x_train, torch.nn.functional.one_hot(y_train, 26), batch_size=64, epochs=4, lr=1e-2,
                           weight_decay=1e-4)
    as_theirs = {k: {l: KSparseProbe(p.weight, torch.tensor(p.bias), p.feature_ids) for l, p in ours[k].items()}
                 for k in ks}
    test_labels = [(w, int(y)) for w, y in zip(vocab, y_test)]
    raw = eval_probe_and_sae_k_sparse_raw_scores(SAEBenchSAE(sae), probe, as_theirs, test_labels, x_test)
    meta = sae_k_sparse_metadata(SAEBenchSAE(sae), probe, as_theirs, sae_name="toy", layer=1)
    table = build_metrics_df(raw, meta, max_k_value=len(ks))
    add_feature_splits_to_metrics_df(table, max_k_value=len(ks), f1_jump_threshold=0.03)
    latents = ab.encode(sae, x_test)
    with torch.no_grad():
        scores = probe(x_test).numpy()
    for i, letter in enumerate(ab.LETTERS):
        row = table[table["letter"] == letter].iloc[0]
        truth = (y_test == i).numpy()
        close(ab.binary_f1(truth, scores[:, i] > 0), row["f1_probe"])
        f1s = [ab.binary_f1(truth, (ours[k][i].score(latents) > 0).numpy()) for k in ks]
        close(f1s, [row[f"f1_sparse_sae_{k}"] for k in ks])
        split = ab.split_features(f1s, [ours[k][i].feature_ids.tolist() for k in ks], 0.03)
        assert split == list(row["split_feats"])


def test_absorption_per_word_matches_saebench_calculator(toy, data):
    from sae_bench.evals.absorption.feature_absorption_calculator import FeatureAbsorptionCalculator
    from sae_bench.evals.absorption.prompting import first_letter_formatter

    lm, sae, vocab = toy
    _, x_train, y_train, _, _ = data
    torch.manual_seed(0)
    probe = ab.train_probe(x_train, torch.nn.functional.one_hot(y_train, 26), batch_size=64, epochs=8, lr=1e-2,
                           weight_decay=1e-4)
    calculator = FeatureAbsorptionCalculator(model=SAEBenchModel(lm), icl_word_list=vocab, max_icl_examples=10,
                                             base_template="{word} has the first letter:",
                                             answer_formatter=first_letter_formatter(), word_token_pos=-6,
                                             batch_size=10)
    config = ab.AbsorptionConfig()
    checked = 0
    for letter, main in (("s", [122, 328]), ("t", [793]), ("b", [514, 31, 50])):
        index = ab.LETTERS.index(letter)
        words = [w for w in vocab if ab.first_letter(w).strip().lower() == letter][:25]
        weight = probe.weights.detach()[index]
        random.seed(7)
        theirs = calculator.calculate_absorption(SAEBenchSAE(sae), words, weight, main, layer=1, show_progress=False)
        direction = weight / weight.norm()
        w_dec = sae.W_dec.detach()
        cos = (w_dec / w_dec.norm(dim=-1, keepdim=True)) @ direction
        ours = ab.absorption_of_words(sae, lm, HOOK, words, vocab, direction, cos, main, config, random.Random(7))
        for mine, their in zip(ours, theirs.word_results, strict=True):
            assert mine.word == their.word
            close(mine.probe_projection, their.probe_projection, atol=1e-5)
            close(mine.absorption_fraction, their.absorption_fraction, atol=1e-5)
            assert mine.is_full_absorption == their.is_full_absorption
            assert mine.top_projection_feats == [s.feature_id for s in their.top_projection_feature_scores]
            checked += 1
    assert checked == 75


def _saebench_aggregate():
    """SAEBench's `_aggregate_results_df`, read from its main.py (which does not import here: see the docstring)."""
    import pandas as pd
    import sae_bench.evals.absorption as package

    source = (Path(package.__file__).parent / "main.py").read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_aggregate_results_df")
    namespace = {"pd": pd}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "sae_bench/evals/absorption/main.py", "exec"), namespace)
    return namespace["_aggregate_results_df"]


def test_aggregation_matches_saebench():
    import pandas as pd

    rng = np.random.default_rng(0)
    rows, per_letter = [], {}
    for letter in "abcdef":
        n = int(rng.integers(2, 9))
        fractions = rng.uniform(0, 1, n) * (rng.uniform(0, 1, n) > 0.5)
        full = rng.uniform(0, 1, n) > 0.7
        split = list(range(int(rng.integers(1, 4))))
        rows += [{"letter": letter, "absorption_fraction": f, "is_full_absorption": b, "num_probe_true_positives": n,
                  "split_feats": split} for f, b in zip(fractions, full)]
        per_letter[letter] = {"num_probe_true_positives": n, "split_feats": split,
                              "absorption_fraction_sum": float(fractions.sum()), "num_full_absorption": int(full.sum())}
    theirs = _saebench_aggregate()(pd.DataFrame(rows))
    config = ab.AbsorptionConfig(min_feats_for_eval=2, min_GT_probe_f1=0.6)
    f1 = dict.fromkeys("abcdef", 0.9) | {"c": 0.5}  # c's probe is too weak: left out, as run_eval leaves it out
    metrics, details = ab.aggregate(per_letter, f1, config)
    assert [d["first_letter"] for d in details] == list("abdef")
    for d in details:
        row = theirs[theirs["letter"] == d["first_letter"]].iloc[0]
        close(d["mean_absorption_fraction"], row["mean_absorption_fraction"])
        close(d["full_absorption_rate"], row["full_absorption_rate"])
        assert d["num_full_absorption"] == row["num_full_absorption"]
        assert d["num_split_features"] == row["num_split_feats"]
    kept = theirs[theirs["letter"] != "c"]
    close(metrics["mean"]["mean_absorption_fraction_score"], kept["mean_absorption_fraction"].mean())
    close(metrics["mean"]["std_dev_full_absorption_score"], kept["full_absorption_rate"].std())


# ----------------------------------------------------------------------------- the eval end to end


def test_word_level_toy_has_no_spelling_and_the_eval_says_so(toy):
    """The toy chat model's tokenizer is word-level: no residual can know a word's letters, so the probe is at
    chance and SAEBench's rule (>= 20 letters with probe F1 > 0.6) refuses to score, in one line."""
    lm, sae, _ = toy
    config = ab.AbsorptionConfig(model_name="toy-chat", max_words=150, k_sparse_probe_num_epochs=3, max_k_value=3)
    run = ab.AbsorptionRun()
    with pytest.raises(ab.AbsorptionError, match=r"letters have a first-letter probe with test F1 > 0.6"):
        ab.run_absorption(sae, lm, HOOK, config, run=run)
    assert run.words_train == 120 and run.words_test == 30
    assert max(run.probe_f1.values()) < 0.6


def test_eval_scores_when_the_probe_bar_is_lowered(toy):
    lm, sae, _ = toy
    config = ab.AbsorptionConfig(model_name="toy-chat", max_words=150, k_sparse_probe_num_epochs=3, max_k_value=3,
                                 min_GT_probe_f1=0.0, min_feats_for_eval=2)
    run = ab.AbsorptionRun()
    metrics, details = ab.run_absorption(sae, lm, HOOK, config, run=run)
    assert set(metrics["mean"]) == {"mean_absorption_fraction_score", "mean_full_absorption_score",
                                    "mean_num_split_features", "std_dev_absorption_fraction_score",
                                    "std_dev_full_absorption_score", "std_dev_num_split_features"}
    assert len(details) >= 2
    for d in details:
        assert 0 <= d["mean_absorption_fraction"] <= 1 and 0 <= d["full_absorption_rate"] <= 1
        assert d["num_full_absorption"] <= d["num_probe_true_positives"]
        assert 1 <= d["num_split_features"] <= 3
    # the details are the per-letter sums the run recorded, divided by the probe's true positives
    for d in details:
        row = run.per_letter[d["first_letter"]]
        assert d["num_probe_true_positives"] == row["num_probe_true_positives"]
        assert d["num_split_features"] == len(run.split_feats[d["first_letter"]])


@pytest.mark.parametrize("change, message", [
    ({"max_k_value": 0}, "max_k_value"), ({"prompt_token_pos": 3}, "prompt_token_pos"),
    ({"max_words": 5}, "max_words"), ({"prompt_template": "no word here"}, "{word}"),
    ({"min_GT_probe_f1": float("nan")}, "min_GT_probe_f1"),
])
def test_bad_config_is_one_line(toy, change, message):
    lm, sae, _ = toy
    with pytest.raises(ab.AbsorptionError, match=message):
        ab.run_absorption(sae, lm, HOOK, ab.AbsorptionConfig(**change))


def test_wrong_model_or_hook_is_one_line(toy):
    lm, sae, _ = toy
    wide = SAE.load(ROOT / "saes/pretrained/smollm2/blocks.15.hook_resid_post")
    with pytest.raises(ab.AbsorptionError, match="d_in=576"):
        ab.run_absorption(wide, lm, HOOK)
    with pytest.raises(ValueError, match="blocks"):
        ab.run_absorption(sae, lm, "blocks.9.hook_resid_post")
