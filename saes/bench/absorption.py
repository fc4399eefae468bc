"""SAEBench's feature absorption eval (`absorption_first_letter`), on a CPU.

The method is SAEBench 0.6.0's (sae_bench/evals/absorption; Chanin et al. 2024, "A is for Absorption"), written
anew for this project's models and SAEs:

1. **Words.** The model's vocabulary tokens made only of ASCII letters (a leading space allowed), shuffled and
   split 80/20 into train and test words. SAEBench uses every such token (~30k for a 50k vocabulary); on a CPU
   ``max_words`` takes the first N of the shuffled list (an extra config field; None: all of them).
2. **Prompts.** Each word in an in-context prompt of ``max_icl_examples=10`` other words of its split, one a line,
   ``"\\n{ex} has the first letter: X\\n...\\n{word} has the first letter:"``; the residual at the SAE's hook is
   read at ``prompt_token_pos`` (-6: the word's token, before " has the first letter:").
3. **The ground-truth probe.** A 26-way one-vs-rest logistic probe on the train residuals (Adam, 50 epochs, batch
   64, lr 1e-2 decaying exponentially to 1e-5, weight decay 1e-4, BCE with positive weights neg/pos).
4. **k-sparse probes.** An L1-penalised one-vs-rest probe on the SAE latents of the train words
   (``k_sparse_probe_l1_decay``, ``k_sparse_probe_num_epochs``, batch ``k_sparse_probe_batch_size``); for each
   letter and k = 1..``max_k_value`` the k latents with the largest weights, and a balanced logistic regression
   (scikit-learn, max_iter 500) on just those. On the test words: F1 of each (score > 0).
5. **Split latents.** Per letter, k grows while the k-sparse probe's F1 rises by more than ``f1_jump_threshold``;
   the latents of the last k that did are the letter's split latents.
6. **Absorption.** For the test words the probe calls right (answer = the letter, probe logit > 0), a fresh
   prompt each (ICL words from the whole vocabulary); with p the probe's unit direction, a the residual, z the
   SAE latents and c_j = cos(p, W_dec[j]): the probe projection a.p, each latent's projection z_j c_j.
   *Absorption fraction*: 0 when the split latents' projection reaches a.p, or the (at most 3) largest positive
   projections of other latents with c_j >= 0.1 give less than 0.4 of a.p; 1 when the split latents' projection
   is <= 0; else min(absorbers, a.p - main) / (that + main). *Full absorption*: no split latent fires, the top
   projecting latent has c >= 0.025 and gives >= 0.4 of a.p > 0.
7. **Scores.** Per letter whose probe has test F1 > ``min_GT_probe_f1``: the mean absorption fraction and the
   full-absorption rate over the probe's true positives, and the number of split latents; the eval's metrics are
   their means and standard deviations over letters, with SAEBench's names. Fewer than ``min_feats_for_eval`` such
   letters: SAEBench reports nothing, and so does this (an `AbsorptionError` says why).

`run_absorption(sae, lm, hook, config)` -> (metrics, details): the two halves of SAEBench's
``eval_result_metrics`` / ``eval_result_details``. Parity with SAEBench's own functions: tests/test_bench_absorption.py.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass, field
from math import exp, log

import numpy as np
import torch
from torch import nn

LETTERS = "abcdefghijklmnopqrstuvwxyz"
_ALPHA = set(LETTERS + LETTERS.upper())

EVAL_TYPE_ID = "absorption_first_letter"

# SAEBench's thresholds (feature_absorption.py's module constants)
FULL_ABSORPTION_PROBE_COS_THRESHOLD = 0.025
ABSORPTION_FRACTION_PROBE_COS_THRESHOLD = 0.1
ABSORPTION_PROBE_PROJECTION_PROPORTION_THRESHOLD = 0.4
ABSORPTION_FRACTION_MAX_ABSORBING_LATENTS = 3
TOPK_PROJECTION_FEATS = 10
MAX_ICL_EXAMPLES = 10
EPS = 1e-8        # "a split latent fired": activation >= EPS (feature_absorption_calculator.EPS)
SUM_EPS = 1e-6    # k_sparse_probing.EPS (the summed-activation F1s)

# the probe's own training settings (SAEBench's train_and_save_probes / train_linear_probe_for_task)
PROBE_BATCH_SIZE = 64
PROBE_EPOCHS = 50
PROBE_LR = 1e-2
PROBE_WEIGHT_DECAY = 1e-4
END_LR = 1e-5
K_SPARSE_L2_DECAY = 1e-6

MAX_WORDS_LIMIT = 200_000
MAX_K_LIMIT = 64


class AbsorptionError(ValueError):
    """The eval cannot run or cannot score (one line)."""


@dataclass
class AbsorptionConfig:
    """SAEBench's AbsorptionEvalConfig: the same field names and defaults, plus ``max_words`` (this project's:
    how many vocabulary words to use, None = all, as SAEBench)."""

    model_name: str = ""
    random_seed: int = 42
    f1_jump_threshold: float = 0.03
    max_k_value: int = 10
    prompt_template: str = "{word} has the first letter:"
    prompt_token_pos: int = -6
    llm_batch_size: int = 10
    llm_dtype: str = "float32"
    k_sparse_probe_l1_decay: float = 0.01
    k_sparse_probe_batch_size: int = 4096
    k_sparse_probe_num_epochs: int = 50
    min_GT_probe_f1: float = 0.6
    min_feats_for_eval: int = 20
    eval_k_sparse_probe_batch_size: int = 24
    precalc_k_sparse_probe_sae_acts: bool = True
    max_words: int | None = None

    def check(self) -> None:
        """Every size and range bounded before any work (one clear line each)."""
        if "{word}" not in self.prompt_template:
            raise AbsorptionError("prompt_template must contain {word}")
        if not 1 <= self.max_k_value <= MAX_K_LIMIT:
            raise AbsorptionError(f"max_k_value must be 1..{MAX_K_LIMIT}, got {self.max_k_value}")
        if self.prompt_token_pos >= 0:
            raise AbsorptionError(f"prompt_token_pos counts from the prompt's end (negative), got {self.prompt_token_pos}")
        if not 1 <= self.llm_batch_size <= 4096 or not 1 <= self.k_sparse_probe_batch_size <= 1 << 20:
            raise AbsorptionError("llm_batch_size must be 1..4096 and k_sparse_probe_batch_size 1..1048576")
        if not 1 <= self.k_sparse_probe_num_epochs <= 10_000:
            raise AbsorptionError(f"k_sparse_probe_num_epochs must be 1..10000, got {self.k_sparse_probe_num_epochs}")
        if not 1 <= self.min_feats_for_eval <= 26:
            raise AbsorptionError(f"min_feats_for_eval must be 1..26, got {self.min_feats_for_eval}")
        for name in ("f1_jump_threshold", "min_GT_probe_f1", "k_sparse_probe_l1_decay"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 1):
                raise AbsorptionError(f"{name} must be in [0, 1], got {value}")
        if self.max_words is not None and not 10 <= self.max_words <= MAX_WORDS_LIMIT:
            raise AbsorptionError(f"max_words must be 10..{MAX_WORDS_LIMIT} (or None: all), got {self.max_words}")

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- words and prompts


def alpha_vocab(tokenizer) -> list[str]:
    """The vocabulary's tokens that are letters only (one leading space allowed), as strings, in id order
    (SAEBench's get_alpha_tokens, which walks the tokenizer's vocab dict)."""
    words = []
    for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        word = tokenizer.convert_tokens_to_string([token])
        if token.startswith("▁") and not word.startswith(" "):  # SentencePiece's leading-space marker
            word = " " + word
        body = word[1:] if word.startswith(" ") else word
        if body and all(ch in _ALPHA for ch in body):
            words.append(word)
    return words


def first_letter(word: str) -> str:
    """SAEBench's answer: " X", the first alphabetic character upper-cased."""
    return " " + next(ch for ch in word.strip() if ch.isalpha()).upper()


@dataclass
class Prompt:
    base: str
    word: str
    label: int  # index into LETTERS


def icl_prompt(word: str, examples: list[str], template: str, rng: random.Random,
               max_icl_examples: int = MAX_ICL_EXAMPLES, max_attempts: int = 1000) -> Prompt:
    """SAEBench's create_icl_prompt: ``max_icl_examples`` examples sampled without replacement (resampled while the
    word itself is among them), one a line with their answer, then the word's line; a leading separator."""
    for _ in range(max_attempts):
        chosen = rng.sample(examples, max_icl_examples)
        if word not in chosen:
            break
    else:
        raise AbsorptionError(f"no in-context examples without {word!r} after {max_attempts} tries")
    lines = [template.format(word=ex) + first_letter(ex) for ex in chosen]
    base = "\n" + "\n".join(lines) + "\n" + template.format(word=word)
    return Prompt(base=base, word=word, label=LETTERS.index(first_letter(word).strip().lower()))


def split_words(vocab: list[str], config: AbsorptionConfig, rng: random.Random) -> tuple[list[str], list[str]]:
    """SAEBench's create_dataset_probe_training split: shuffled, the first 80% train (``max_words`` first)."""
    shuffled = rng.sample(vocab, len(vocab))
    if config.max_words is not None:
        shuffled = shuffled[:config.max_words]
    cut = int(len(shuffled) * 0.8)
    return shuffled[:cut], shuffled[cut:]


# ----------------------------------------------------------------------------- the model's residuals


def prompt_ids(lm, text: str) -> list[int]:
    """The prompt's tokens led by the model's start token (as TransformerLens' prepend_bos, and as the SAE's
    training sequences: interp.lm_text.token_sequences)."""
    from interp.lm_text import start_token

    start, _ = start_token(lm.tokenizer)
    return [start] + lm.tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def residuals_at(lm, hook: str, texts: list[str], position: int, batch_size: int) -> torch.Tensor:
    """(len(texts), d_model) float32: the residual at ``hook`` at ``position`` counted from each prompt's own end
    (right padding; the forward pass stops after the hook's layer)."""
    from interp.hooks.lm import capture_residuals, right_padded

    out = []
    for start in range(0, len(texts), batch_size):
        seqs = [prompt_ids(lm, text) for text in texts[start:start + batch_size]]
        if min(map(len, seqs)) < -position:
            raise AbsorptionError(f"a prompt has fewer than {-position} tokens: prompt_token_pos {position} "
                                  f"does not fit the template")
        ids, mask = right_padded(lm, seqs)
        acts = capture_residuals(lm, ids, mask, names=[hook])[hook]
        rows = torch.arange(len(seqs))
        cols = torch.tensor([len(s) + position for s in seqs])
        out.append(acts[rows, cols].float().cpu())
    return torch.cat(out) if out else torch.zeros(0, lm.d_model)


# ----------------------------------------------------------------------------- probes


class LinearProbe(nn.Module):
    def __init__(self, dim: int, outputs: int):
        super().__init__()
        self.fc = nn.Linear(dim, outputs)

    def forward(self, x):
        return self.fc(x)

    @property
    def weights(self) -> torch.Tensor:
        return self.fc.weight


def train_probe(x: torch.Tensor, y: torch.Tensor, *, batch_size: int, epochs: int, lr: float, weight_decay: float,
                end_lr: float = END_LR, l1_decay: float = 0.0, map_acts=None, probe_dim: int | None = None
                ) -> LinearProbe:
    """A one-vs-rest logistic probe per column of the multi-hot ``y`` (SAEBench's train_multi_probe: Adam,
    exponential lr decay per epoch, BCE with pos_weight neg/pos per column, an optional L1 term
    l1_decay * mean over outputs of sum |w|, ``map_acts`` applied to each batch). The global torch RNG draws the
    initial weights and each epoch's order, in the order SAEBench draws them. A column with no positives gets
    pos_weight 1 (SAEBench would divide by zero; such a letter is never scored)."""
    y = y.to(x.dtype)
    positives = y.sum(0)
    pos_weight = torch.where(positives > 0, (len(y) - positives) / positives.clamp(min=1), torch.ones_like(positives))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    probe = LinearProbe(probe_dim or x.shape[-1], y.shape[-1]).to(dtype=x.dtype)
    probe.train()
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=exp(log(end_lr / lr) / epochs))
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    with torch.enable_grad():
        for _ in range(epochs):
            for xb, yb in loader:
                if map_acts is not None:
                    xb = map_acts(xb)
                optimizer.zero_grad()
                loss = loss_fn(probe(xb), yb)
                if l1_decay:
                    loss = loss + l1_decay * probe.weights.abs().sum(dim=-1).mean()
                loss.backward()
                optimizer.step()
            scheduler.step()
    probe.eval()
    return probe


@dataclass
class KSparseProbe:
    feature_ids: torch.Tensor  # (k,)
    weight: torch.Tensor       # (k,)
    bias: float

    def score(self, latents: torch.Tensor) -> torch.Tensor:
        return latents[:, self.feature_ids] @ self.weight + self.bias


@torch.no_grad()
def encode(sae, x: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    return torch.cat([sae.encode(x[i:i + batch_size]).float() for i in range(0, len(x), batch_size)]) \
        if len(x) else torch.zeros(0, sae.cfg.d_sae)


def train_k_sparse_probes(sae, x_train: torch.Tensor, y_train: torch.Tensor, ks: list[int], *, l1_decay: float,
                          batch_size: int, epochs: int, latents: torch.Tensor | None = None
                          ) -> dict[int, dict[int, KSparseProbe]]:
    """SAEBench's train_k_sparse_probes: the L1 probe on the SAE's latents, then per k and present letter the k
    largest-weight latents and a balanced scikit-learn logistic regression on them."""
    from sklearn.linear_model import LogisticRegression

    onehot = torch.nn.functional.one_hot(y_train, num_classes=len(LETTERS))
    present = sorted(set(y_train.tolist()))
    if latents is None:  # SAEBench's precalc_sae_acts=False: encode each batch (same numbers, less memory)
        l1_probe = train_probe(x_train, onehot, batch_size=batch_size, epochs=epochs, lr=0.01,
                               weight_decay=K_SPARSE_L2_DECAY, l1_decay=l1_decay,
                               map_acts=lambda b: sae.encode(b).float(), probe_dim=sae.cfg.d_sae)
        latents = encode(sae, x_train)
    else:
        l1_probe = train_probe(latents, onehot, batch_size=batch_size, epochs=epochs, lr=0.01,
                               weight_decay=K_SPARSE_L2_DECAY, l1_decay=l1_decay)
    weights = l1_probe.weights.detach().float()
    labels = y_train.numpy()
    out: dict[int, dict[int, KSparseProbe]] = {}
    for k in ks:
        out[k] = {}
        for letter in present:
            ids = weights[letter].topk(k).indices
            fit = LogisticRegression(max_iter=500, class_weight="balanced").fit(
                latents[:, ids].numpy(), (labels == letter).astype(np.int64))
            out[k][letter] = KSparseProbe(ids, torch.tensor(fit.coef_[0]).float(), float(fit.intercept_[0]))
    return out


def binary_f1(y: np.ndarray, pred: np.ndarray) -> float:
    """scikit-learn's f1_score for a binary task (0 when there is no true or predicted positive)."""
    tp = int(np.sum(y & pred))
    denominator = int(np.sum(y)) + int(np.sum(pred))
    return 2 * tp / denominator if denominator else 0.0


def split_features(f1_by_k: list[float], feats_by_k: list[list[int]], jump: float) -> list[int]:
    """SAEBench's add_feature_splits_to_metrics_df for one letter: grow k while F1 rises by more than ``jump``."""
    prev_best, split = -100.0, []
    for f1, feats in zip(f1_by_k, feats_by_k):
        if f1 > prev_best + jump:
            prev_best, split = f1, feats
        else:
            break
    return split


# ----------------------------------------------------------------------------- absorption per word


@dataclass
class WordAbsorption:
    word: str
    absorption_fraction: float
    is_full_absorption: bool
    probe_projection: float
    top_projection_feats: list[int] = field(default_factory=list)


def word_absorption(acts: torch.Tensor, latents: torch.Tensor, probe_direction: torch.Tensor,
                    cos_sims: torch.Tensor, main_ids: list[int], words: list[str]) -> list[WordAbsorption]:
    """SAEBench's FeatureAbsorptionCalculator.calculate_absorption from the residuals ``acts`` (n, d) and their
    latents (n, d_sae): ``probe_direction`` a unit vector, ``cos_sims`` (d_sae,) its cosine with each decoder row."""
    results = []
    main = torch.tensor(main_ids, dtype=torch.long)
    projections = latents * cos_sims
    act_proj = acts @ probe_direction
    candidates = cos_sims >= ABSORPTION_FRACTION_PROBE_COS_THRESHOLD
    for i, word in enumerate(words):
        proj = projections[i]
        a_p = float(act_proj[i])
        main_proj = float(proj[main].sum())
        mask = candidates & (proj > 0)
        mask[main] = False
        absorbers = proj[mask]
        absorbers_total = float(absorbers.topk(min(ABSORPTION_FRACTION_MAX_ABSORBING_LATENTS, absorbers.numel())).values.sum())
        if main_proj >= a_p or absorbers_total / a_p < ABSORPTION_PROBE_PROJECTION_PROPORTION_THRESHOLD:
            fraction = 0.0
        elif main_proj <= 0.0:
            fraction = 1.0
        else:
            absorbed = min(absorbers_total, a_p - main_proj)
            fraction = float(np.clip(absorbed / (absorbed + main_proj), 0.0, 1.0))
        top = proj.topk(TOPK_PROJECTION_FEATS).indices.tolist()
        full = (all(float(latents[i, j]) < EPS for j in main_ids)
                and float(cos_sims[top[0]]) >= FULL_ABSORPTION_PROBE_COS_THRESHOLD
                and a_p >= 0
                and float(proj[top[0]]) / a_p >= ABSORPTION_PROBE_PROJECTION_PROPORTION_THRESHOLD)
        results.append(WordAbsorption(word, fraction, full, a_p, top))
    return results


def absorption_of_words(sae, lm, hook: str, words: list[str], vocab: list[str], direction: torch.Tensor,
                        cos_row: torch.Tensor, main_ids: list[int], config: AbsorptionConfig,
                        rng: random.Random) -> list[WordAbsorption]:
    """Each word in a fresh prompt (in-context words from ``vocab``), its residual and latents, scored by
    `word_absorption` (SAEBench's calculator, batch by batch)."""
    prompts = [icl_prompt(w, vocab, config.prompt_template, rng) for w in words]
    acts = residuals_at(lm, hook, [p.base for p in prompts], config.prompt_token_pos, config.llm_batch_size)
    return word_absorption(acts, encode(sae, acts), direction, cos_row, main_ids, words)


# ----------------------------------------------------------------------------- the eval


def check_inputs(sae, lm, hook: str) -> None:
    """The SAE reads this model at this hook (one line otherwise)."""
    from interp.hooks.lm import parse_hook_name
    from interp.names import LM

    if getattr(lm, "kind", None) != LM or getattr(lm, "tokenizer", None) is None:  # the protocol's kind
        raise AbsorptionError("absorption_first_letter is an LM metric: the model is not a language model")
    parse_hook_name(hook, lm.n_layers)
    if sae.cfg.d_in != lm.d_model:
        raise AbsorptionError(f"the SAE reads d_in={sae.cfg.d_in} but {lm.name} has d_model={lm.d_model} at {hook}")


def aggregate(per_letter: dict[str, dict], probe_f1: dict[str, float], config: AbsorptionConfig) -> tuple[dict, list[dict]]:
    """SAEBench's _aggregate_results_df and run_eval's filter: letters whose probe F1 > min_GT_probe_f1."""
    details = []
    for letter in LETTERS:
        row = per_letter.get(letter)
        if row is None or not probe_f1.get(letter, 0.0) > config.min_GT_probe_f1:
            continue
        n = row["num_probe_true_positives"]
        details.append({"first_letter": letter,
                        "mean_absorption_fraction": row["absorption_fraction_sum"] / n,
                        "full_absorption_rate": row["num_full_absorption"] / n,
                        "num_full_absorption": int(row["num_full_absorption"]),
                        "num_probe_true_positives": int(n),
                        "num_split_features": len(row["split_feats"])})
    if len(details) < max(config.min_feats_for_eval, 2):
        raise AbsorptionError(f"only {len(details)} letters have a first-letter probe with test F1 > "
                              f"{config.min_GT_probe_f1} (and a true positive); the eval needs "
                              f"{max(config.min_feats_for_eval, 2)} (min_feats_for_eval)")

    def column(name):
        return [d[name] for d in details]

    fractions, full, splits = column("mean_absorption_fraction"), column("full_absorption_rate"), column("num_split_features")
    metrics = {"mean": {
        "mean_absorption_fraction_score": statistics.mean(fractions),
        "mean_full_absorption_score": statistics.mean(full),
        "mean_num_split_features": statistics.mean(splits),
        "std_dev_absorption_fraction_score": statistics.stdev(fractions),
        "std_dev_full_absorption_score": statistics.stdev(full),
        "std_dev_num_split_features": statistics.stdev(splits),
    }}
    return metrics, details


@dataclass
class AbsorptionRun:
    """What the eval computed on the way (for reports and tests)."""

    words_train: int = 0
    words_test: int = 0
    probe_f1: dict = field(default_factory=dict)
    split_feats: dict = field(default_factory=dict)
    k_sparse_f1: dict = field(default_factory=dict)
    per_letter: dict = field(default_factory=dict)


def run_absorption(sae, lm, hook: str, config: AbsorptionConfig | None = None, progress=None,
                   run: AbsorptionRun | None = None) -> tuple[dict, list[dict]]:
    """SAEBench's absorption eval of ``sae`` at ``hook`` of ``lm`` -> (eval_result_metrics, eval_result_details).
    ``progress``: a callable(str) told each stage. ``run``: filled with the intermediate results."""
    config = config or AbsorptionConfig()
    config.check()
    check_inputs(sae, lm, hook)
    say = progress or (lambda message: None)
    run = run if run is not None else AbsorptionRun()
    sae = sae.astype("float32") if sae.W_enc.dtype != torch.float32 else sae
    rng = random.Random(config.random_seed)
    torch.manual_seed(config.random_seed)

    vocab = alpha_vocab(lm.tokenizer)
    if len(vocab) < MAX_ICL_EXAMPLES + 2:
        raise AbsorptionError(f"the tokenizer has {len(vocab)} letter-only tokens; the eval needs at least "
                              f"{MAX_ICL_EXAMPLES + 2}")
    train_words, test_words = split_words(vocab, config, rng)
    if len(test_words) < MAX_ICL_EXAMPLES + 1:
        raise AbsorptionError(f"{len(test_words)} test words cannot fill {MAX_ICL_EXAMPLES} in-context examples: "
                              f"raise max_words")
    run.words_train, run.words_test = len(train_words), len(test_words)
    train = [icl_prompt(w, train_words, config.prompt_template, rng) for w in train_words]
    test = [icl_prompt(w, test_words, config.prompt_template, rng) for w in test_words]

    say(f"residuals of {len(train)} train and {len(test)} test prompts")
    x_train = residuals_at(lm, hook, [p.base for p in train], config.prompt_token_pos, config.llm_batch_size)
    x_test = residuals_at(lm, hook, [p.base for p in test], config.prompt_token_pos, config.llm_batch_size)
    y_train = torch.tensor([p.label for p in train])
    y_test = np.array([p.label for p in test])

    say("first-letter probe")
    probe = train_probe(x_train, torch.nn.functional.one_hot(y_train, num_classes=len(LETTERS)),
                        batch_size=PROBE_BATCH_SIZE, epochs=PROBE_EPOCHS, lr=PROBE_LR, weight_decay=PROBE_WEIGHT_DECAY)
    with torch.no_grad():
        probe_scores = probe(x_test).float().numpy()

    say("k-sparse probes on the SAE's latents")
    ks = list(range(1, config.max_k_value + 1))
    latents_train = encode(sae, x_train) if config.precalc_k_sparse_probe_sae_acts else None
    k_probes = train_k_sparse_probes(sae, x_train, y_train, ks, l1_decay=config.k_sparse_probe_l1_decay,
                                     batch_size=config.k_sparse_probe_batch_size,
                                     epochs=config.k_sparse_probe_num_epochs, latents=latents_train)
    latents_test = encode(sae, x_test)

    # per letter: probe F1 on the test words, split latents, the probe's true positives
    positives: dict[str, list[str]] = {}
    split: dict[str, list[int]] = {}
    for index, letter in enumerate(LETTERS):
        truth = y_test == index
        run.probe_f1[letter] = binary_f1(truth, probe_scores[:, index] > 0.0)
        if index not in k_probes[ks[0]]:
            continue
        f1s = [binary_f1(truth, (k_probes[k][index].score(latents_test) > 0.0).numpy()) for k in ks]
        feats = [k_probes[k][index].feature_ids.tolist() for k in ks]
        run.k_sparse_f1[letter] = f1s
        split[letter] = split_features(f1s, feats, config.f1_jump_threshold)
        positives[letter] = [test_words[i] for i in np.flatnonzero(truth & (probe_scores[:, index] > 0))]
    run.split_feats = split

    say("absorption on the probe's true positives")
    with torch.no_grad():
        directions = probe.weights.detach().float()
        directions = directions / directions.norm(dim=-1, keepdim=True)
        w_dec = sae.W_dec.detach().float()
        cos = directions @ (w_dec / w_dec.norm(dim=-1, keepdim=True).clamp(min=1e-8)).T  # (26, d_sae)
    per_letter: dict[str, dict] = {}
    for letter, words in positives.items():
        if not words:
            continue
        index = LETTERS.index(letter)
        scored = absorption_of_words(sae, lm, hook, words, vocab, directions[index], cos[index], split[letter],
                                     config, rng)
        per_letter[letter] = {"num_probe_true_positives": len(words), "split_feats": split[letter],
                              "absorption_fraction_sum": sum(s.absorption_fraction for s in scored),
                              "num_full_absorption": sum(s.is_full_absorption for s in scored)}
    run.per_letter = per_letter
    return aggregate(per_letter, run.probe_f1, config)
