"""SAEBench's SCR (spurious correlation removal) and TPP (targeted probe perturbation) evals, on a CPU.

The method is SAEBench 0.6.0's (sae_bench/evals/scr_and_tpp/main.py; Karvonen et al. 2025), written anew:

- **Activations.** Each text as ``[start] + its first context_length - 1 tokens``; the residual at the SAE's hook
  at every token, the start token's (and any pad / EOS / BOS) zeroed; a text's vector is the mean over its
  non-zero positions.
- **Probes.** One linear probe per class (AdamW, lr ``probe_lr``, batch ``probe_train_batch_size``, BCE plus
  ``probe_l1_penalty`` * sum |w|, ``probe_epochs`` epochs, the epoch with the best test accuracy kept, early stop
  after ``early_stopping_patience`` epochs without one). Positives: the class's texts; negatives: as many texts of
  its paired class (SCR) or drawn evenly from the other classes (TPP).
- **Latent effects.** For the probe of class c: (mean latent activation over c's positives - over its negatives),
  times each latent's decoder direction dotted with the probe's weight; SCR takes |effect|, TPP keeps positive mean
  differences only. The top-n latents by effect (n in ``n_values``; only non-zero effects) are zero-ablated in the
  SAE's reconstruction, its error term kept: x' = decode(f with those set to 0) + (x - decode(f)).
- **SCR.** Data with two binary attributes, one spuriously tied to the other in the biased training set
  ("male_professor / female_nurse"). Ablating the latents of the spurious attribute's probe ("male / female") should
  lift the biased probe's accuracy on data balanced in it ("professor / nurse"):
  ``scr_dir1_threshold_n = (acc_ablated - acc_biased) / (acc_clean - acc_biased)`` with acc_clean the
  concept's own probe on that data (0 when that gap is < 0.001), dir2 the same the other way round, and
  ``scr_metric_threshold_n`` the direction whose biased probe started lower (SAEBench's get_scr_plotting_dict).
- **TPP.** For each class, ablating its probe's top-n latents: ``tpp_threshold_n_intended_diff_only`` = that
  probe's accuracy drop, ``..._unintended_diff_only`` = the mean drop of the other classes' probes, and
  ``..._total_metric`` = intended - unintended; averaged over classes (create_tpp_plotting_dict).

**The data (built offline; SAEBench's Bias in Bios and Amazon reviews need a download).** Labelled texts in JSONL,
either Dolly's records (``instruction`` as the text, ``category`` as the label; /work/shared/data/dolly-sample.jsonl
holds 1,502) or ``{"text", "label"}`` records. For SCR the spurious attribute is *planted*: within each pair of
classes (A, B), 2/3 of A's texts stay as written and 1/3 are lower-cased, and the reverse for B, so that "as written"
plays gender's role (column 2) and the class plays profession's (column 1); a casing change touches every token,
as a biography's gender does. The quadrants are then cut as SAEBench's get_spurious_corr_data cuts them (the biased
set: A-as-written vs B-lower-cased, 2 x ``train_set_size // 4`` texts each). TPP uses the classes as they are,
``train_set_size // 2`` / ``test_set_size // 2`` texts of each (two of SAEBench's quadrants per class).

`run_scr(sae, lm, hook, records, config)` / `run_tpp(...)` -> (metrics, details) in SAEBench's form. Parity with
SAEBench's own functions: tests/test_bench_scr_tpp.py.
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

EVAL_TYPE_ID_SCR = "scr"
EVAL_TYPE_ID_TPP = "tpp"
DATASET_NAME = "dolly-sample"
POSITIVE, NEGATIVE = 1, 0
PAIRED_CLASS_KEYS = {"male / female": "female_data_only", "professor / nurse": "nurse_data_only",
                     "male_professor / female_nurse": "female_nurse_data_only"}
MAX_TEXTS = 100_000
MAX_N_VALUE = 1 << 20


class ScrTppError(ValueError):
    """The eval cannot run on this input (one line)."""


@dataclass
class ScrTppConfig:
    """SAEBench's ScrAndTppEvalConfig: the same field names; defaults sized for a CPU and the 1,502 Dolly records
    (SAEBench: train_set_size 4000, test_set_size 1000, llm_batch_size per model)."""

    random_seed: int = 42
    dataset_names: list[str] = field(default_factory=lambda: [DATASET_NAME])
    perform_scr: bool = True
    early_stopping_patience: int = 20
    train_set_size: int = 160
    test_set_size: int = 40
    context_length: int = 128
    probe_train_batch_size: int = 16
    probe_test_batch_size: int = 500
    probe_epochs: int = 20
    probe_lr: float = 1e-3
    probe_l1_penalty: float = 1e-3
    sae_batch_size: int = 125
    llm_batch_size: int = 32
    llm_dtype: str = "float32"
    lower_vram_usage: bool = False
    model_name: str = ""
    n_values: list[int] = field(default_factory=lambda: [2, 5, 10, 20, 50, 100, 500])
    column1_vals_lookup: dict = field(default_factory=lambda: {
        DATASET_NAME: [["open_qa", "classification"], ["closed_qa", "brainstorming"]]})
    tpp_classes: list[str] = field(default_factory=lambda: [
        "open_qa", "general_qa", "classification", "closed_qa", "brainstorming"])

    def check(self) -> None:
        for name, low, high in (("train_set_size", 8, MAX_TEXTS), ("test_set_size", 4, MAX_TEXTS),
                                ("context_length", 2, 4096), ("probe_train_batch_size", 1, 65536),
                                ("probe_test_batch_size", 1, 65536), ("probe_epochs", 1, 10_000),
                                ("early_stopping_patience", 1, 10_000), ("sae_batch_size", 1, 65536),
                                ("llm_batch_size", 1, 4096)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ScrTppError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        if not self.n_values or any(not isinstance(n, int) or not 1 <= n <= MAX_N_VALUE for n in self.n_values):
            raise ScrTppError(f"n_values must be whole numbers from 1 to {MAX_N_VALUE}, got {self.n_values!r}")
        for name in ("probe_lr", "probe_l1_penalty"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 10):
                raise ScrTppError(f"{name} must be a number from 0 to 10, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- data


def read_labelled(path: str | Path) -> list[tuple[str, str]]:
    """(text, label) of a JSONL file of Dolly records (instruction, category) or {"text", "label"} records."""
    path = Path(path)
    if not path.is_file():
        raise ScrTppError(f"no dataset file at {path}")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ScrTppError(f"{path}:{number} is not a JSON object") from None
        if not isinstance(row, dict):
            raise ScrTppError(f"{path}:{number} is not a JSON object")
        text, label = (row.get("text"), row.get("label")) if "text" in row else (row.get("instruction"),
                                                                                row.get("category"))
        if not isinstance(text, str) or not text.strip() or not isinstance(label, (str, int)):
            raise ScrTppError(f"{path}:{number} needs a non-empty text (text / instruction) and a label "
                              f"(label / category)")
        records.append((text, str(label)))
        if len(records) > MAX_TEXTS:
            raise ScrTppError(f"{path} holds more than {MAX_TEXTS} records")
    if len({label for _, label in records}) < 2:
        raise ScrTppError(f"{path} has fewer than two classes: SCR and TPP need labelled classes to tell apart")
    return records


def _by_class(records, rng: random.Random) -> dict[str, tuple[list[str], list[str]]]:
    """label -> (train texts, test texts): each class shuffled and split 80/20."""
    texts: dict[str, list[str]] = {}
    for text, label in records:
        texts.setdefault(label, []).append(text)
    out = {}
    for label in sorted(texts):
        shuffled = rng.sample(texts[label], len(texts[label]))
        cut = int(len(shuffled) * 0.8)
        out[label] = (shuffled[:cut], shuffled[cut:])
    return out


def plant(text: str) -> str:
    """The planted surface feature's negative value: the text lower-cased."""
    return text.lower()


def spurious_sets(pos_texts: list[str], neg_texts: list[str], per_quadrant: int, seed: int,
                  where: str) -> dict[str, list[str]]:
    """SAEBench's get_spurious_corr_data on a planted attribute: class A (pos) texts 2/3 as written (column 2
    positive) and 1/3 lower-cased, class B the reverse; then its six sets of 2 x per_quadrant texts."""
    a_cut, b_cut = (2 * len(pos_texts)) // 3, len(neg_texts) // 3
    pos_pos = pos_texts[:a_cut]                              # A, as written   ("male professor")
    neg_pos = [plant(t) for t in pos_texts[a_cut:]]          # A, lower-cased  ("female professor")
    pos_neg = neg_texts[:b_cut]                              # B, as written   ("male nurse")
    neg_neg = [plant(t) for t in neg_texts[b_cut:]]          # B, lower-cased  ("female nurse")
    smallest = min(len(pos_neg), len(neg_pos), len(pos_pos) // 2, len(neg_neg) // 2)
    if smallest < per_quadrant or len(pos_pos) <= 2 * per_quadrant or len(neg_neg) <= 2 * per_quadrant:
        raise ScrTppError(f"the {where} texts of this class pair fill only {smallest} per quadrant, fewer than "
                          f"{per_quadrant}: lower train_set_size / test_set_size or give more data")
    m = per_quadrant
    sets = {"male / female": pos_pos[:m] + pos_neg[:m], "female_data_only": neg_pos[:m] + neg_neg[:m],
            "professor / nurse": pos_pos[:m] + neg_pos[:m], "nurse_data_only": pos_neg[:m] + neg_neg[:m],
            "male_professor / female_nurse": pos_pos[:2 * m], "female_nurse_data_only": neg_neg[:2 * m]}
    rng = np.random.default_rng(seed)
    for key in ("male / female", "female_data_only", "professor / nurse", "nurse_data_only",
                "male_professor / female_nurse", "female_nurse_data_only"):
        rng.shuffle(sets[key])
    return sets


# ----------------------------------------------------------------------------- activations


@torch.no_grad()
def token_activations(lm, hook: str, texts: list[str], context_length: int, batch_size: int) -> torch.Tensor:
    """(len(texts), longest, d_model) float32: the residual at ``hook`` of each text's tokens, zero at the start
    token, padding and any BOS / EOS / pad token (SAEBench's mask_bos_pad_eos_tokens)."""
    from interp.hooks.lm import capture_residuals, right_padded
    from interp.lm_text import start_token

    tok = lm.tokenizer
    start, _ = start_token(tok)
    special = {t for t in (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, start) if t is not None}
    seqs = [[start] + tok(t, add_special_tokens=False, truncation=True, max_length=context_length - 1)["input_ids"]
                      for t in texts]
    width = max(map(len, seqs))
    out = torch.zeros(len(seqs), width, lm.d_model)
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i:i + batch_size]
        ids, mask = right_padded(lm, chunk)
        acts = capture_residuals(lm, ids, mask, names=[hook])[hook].float().cpu()
        keep = mask.bool() & ~torch.isin(ids, torch.tensor(sorted(special)))
        out[i:i + len(chunk), :ids.shape[1]] = acts * keep[..., None]
    return out


def meaned(acts_BLD: torch.Tensor) -> torch.Tensor:
    """SAEBench's create_meaned_model_activations: the mean over each text's non-zero positions."""
    nonzero = (acts_BLD.sum(-1) != 0.0).to(acts_BLD.dtype).sum(-1)
    return acts_BLD.sum(1) / nonzero[:, None]


# ----------------------------------------------------------------------------- probes


class Probe(nn.Module):
    def __init__(self, dim: int, dtype=torch.float32):
        super().__init__()
        self.net = nn.Linear(dim, 1, bias=True, dtype=dtype)

    def forward(self, x):
        return self.net(x).squeeze(-1)


def probe_data(acts: dict[str, torch.Tensor], name: str, perform_scr: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """SAEBench's prepare_probe_data: the class's texts as positives, as many negatives (its paired set for SCR,
    an even draw over the other classes for TPP), shuffled; the global torch RNG draws, in SAEBench's order."""
    positives = acts[name]
    if perform_scr:
        pairs = {**PAIRED_CLASS_KEYS, **{v: k for k, v in PAIRED_CLASS_KEYS.items()}}
        negatives = acts[pairs[name]]
    else:
        others = [k for k in acts if k != name]
        per_class = math.ceil(len(positives) / len(others))
        negatives = torch.cat([acts[k][torch.randperm(len(acts[k]))[:per_class]] for k in others])
    negatives = negatives[torch.randperm(len(negatives))[:len(positives)]]
    if negatives.shape != positives.shape:
        raise ScrTppError(f"class {name!r} has {len(positives)} texts but only {len(negatives)} negatives to pair")
    x = torch.cat([positives, negatives])
    y = torch.empty(len(x), dtype=torch.int)
    y[:len(positives)], y[len(positives):] = POSITIVE, NEGATIVE
    order = torch.randperm(len(x))
    return x[order], y[order]


@torch.no_grad()
def probe_accuracy(x: torch.Tensor, y: torch.Tensor, batch_size: int, probe: Probe) -> float:
    correct = [((probe(x[i:i + batch_size]) > 0.0).long() == y[i:i + batch_size]).float()
               for i in range(0, len(y), batch_size)]
    return torch.cat(correct).mean().item()


def train_probe(x_train, y_train, x_test, y_test, config: ScrTppConfig) -> tuple[Probe, float]:
    """SAEBench's train_probe_gpu: AdamW, BCE + l1 * sum |w|, the best-test-accuracy epoch, early stopping."""
    probe = Probe(x_train.shape[1], x_train.dtype)
    optimizer = torch.optim.AdamW(probe.parameters(), lr=config.probe_lr)
    loss_fn = nn.BCEWithLogitsLoss()
    best, best_probe, patience = 0.0, None, 0
    bs = config.probe_train_batch_size
    with torch.enable_grad():
        for _ in range(config.probe_epochs):
            order = torch.randperm(len(x_train))
            for i in range(0, len(x_train), bs):
                batch = order[i:i + bs]
                loss = loss_fn(probe(x_train[batch]), y_train[batch].to(x_train.dtype))
                if config.probe_l1_penalty is not None:
                    loss = loss + config.probe_l1_penalty * probe.net.weight.abs().sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            accuracy = probe_accuracy(x_test, y_test, bs, probe)
            if accuracy > best:
                best, best_probe, patience = accuracy, copy.deepcopy(probe), 0
            else:
                patience += 1
            if patience >= config.early_stopping_patience:
                break
    if best_probe is None:
        raise ScrTppError("a probe never beat 0 test accuracy (the test set may be empty)")
    return best_probe, best


def train_probes(train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], config: ScrTppConfig
                 ) -> dict[str, Probe]:
    probes = {}
    for name in train:
        x, y = probe_data(train, name, config.perform_scr)
        xt, yt = probe_data(test, name, config.perform_scr)
        probes[name], _ = train_probe(x, y, xt, yt, config)
    return probes


def test_accuracies(probes, classes, acts, batch_size: int, perform_scr: bool) -> dict[str, float]:
    """SAEBench's get_probe_test_accuracy (with the SCR cross-accuracies: each paired probe on the others' data)."""
    out = {}
    for name in classes:
        x, y = probe_data(acts, name, perform_scr)
        out[name] = probe_accuracy(x, y, batch_size, probes[name])
    if perform_scr:
        for name in classes:
            if name not in PAIRED_CLASS_KEYS:
                continue
            x, y = probe_data(acts, name, True)
            for other in (k for k in PAIRED_CLASS_KEYS if k != name):
                out[f"{other} probe on {name} data"] = probe_accuracy(x, y, batch_size, probes[other])
    return out


# ----------------------------------------------------------------------------- latents: effects and ablation


def _nonzero_tokens(acts_BLD: torch.Tensor) -> torch.Tensor:
    return (acts_BLD.sum(-1) != 0.0).to(acts_BLD.dtype)


def _encode_tokens(sae, acts_BLD: torch.Tensor, keep_BL: torch.Tensor) -> torch.Tensor:
    """(B, L, d_sae) latents of the kept positions, zeros elsewhere: only the texts' own tokens are encoded."""
    out = torch.zeros(*acts_BLD.shape[:2], sae.W_dec.shape[0])
    out[keep_BL] = sae.encode(acts_BLD[keep_BL]).float()
    return out


@torch.no_grad()
def latent_effects(sae, probe: Probe, name: str, train_BLD: dict[str, torch.Tensor], perform_scr: bool,
                   sae_batch_size: int) -> torch.Tensor:
    """SAEBench's get_effects_per_class_precomputed_acts: (d_sae,) effect of each latent on the class's probe."""
    x, y = probe_data(train_BLD, name, perform_scr)
    d_sae = sae.W_dec.shape[0]
    pos_sum, neg_sum = torch.zeros(d_sae), torch.zeros(d_sae)
    n_pos = n_neg = 0
    for i in range(0, len(x), sae_batch_size):
        batch, labels = x[i:i + sae_batch_size], y[i:i + sae_batch_size]
        nonzero = _nonzero_tokens(batch)
        latents = _encode_tokens(sae, batch, nonzero.bool())  # zero at masked positions, as SAEBench's mask makes it
        mean = latents.sum(1) / nonzero.sum(-1)[:, None]
        pos_sum += mean[labels == POSITIVE].sum(0)
        neg_sum += mean[labels == NEGATIVE].sum(0)
        n_pos += int((labels == POSITIVE).sum())
        n_neg += int((labels == NEGATIVE).sum())
    diff = (pos_sum / n_pos if n_pos else pos_sum) - (neg_sum / n_neg if n_neg else neg_sum)
    along_probe = (probe.net.weight.float() @ sae.W_dec.float().T).squeeze()
    if not perform_scr:
        diff = diff.clamp(min=0.0)
    effects = diff * along_probe
    return effects.abs() if perform_scr else effects


def top_latents(effects: torch.Tensor, n: int) -> torch.Tensor:
    """SAEBench's select_top_n_features: a mask of the n largest effects among the non-zero ones."""
    if n > effects.numel():
        raise ScrTppError(f"n_values holds {n}, more than the SAE's {effects.numel()} latents")
    k = min(n, int((effects != 0).sum()))
    mask = torch.zeros_like(effects, dtype=torch.bool)
    if k:
        mask[torch.topk(effects, k).indices] = True
    return mask


@torch.no_grad()
def ablated_means(acts_BLD: torch.Tensor, sae, ablate: torch.Tensor, sae_batch_size: int) -> torch.Tensor:
    """SAEBench's ablated_precomputed_activations: per text, the mean over its non-zero positions of
    decode(f with ``ablate`` zeroed) + (x - decode(f)). Only the text's own positions are encoded and summed:
    SAEBench also sums its padded positions (to context_length), where x = 0 but decode(f_ablated) - decode(f)
    is not 0 when an ablated latent fires on a zero input (TopK, JumpReLU); this leaves that out (the same
    numbers when no position is padded: the parity test) and does not spend a CPU on padding."""
    out = []
    for i in range(0, len(acts_BLD), sae_batch_size):
        batch = acts_BLD[i:i + sae_batch_size]
        keep = _nonzero_tokens(batch).bool()
        tokens = batch[keep]
        latents = sae.encode(tokens)
        error = tokens - sae.decode(latents)
        latents[..., ablate] = 0.0
        modified = torch.zeros_like(batch)
        modified[keep] = (sae.decode(latents) + error).float()
        out.append(modified.sum(1) / keep.sum(-1).to(batch.dtype)[:, None])
    return torch.cat(out)


def ablation_accuracies(probes, sae, test_BLD, effects, config: ScrTppConfig, classes) -> dict:
    """SAEBench's perform_feature_ablations: [ablated class][n][evaluated probe] -> accuracy."""
    out = {}
    for ablated in classes:
        out[ablated] = {}
        for n in config.n_values:
            mask = top_latents(effects[ablated], n)
            acts = {name: ablated_means(x, sae, mask, config.sae_batch_size) for name, x in test_BLD.items()}
            out[ablated][n] = test_accuracies(probes, classes, acts, config.probe_test_batch_size, config.perform_scr)
    return out


# ----------------------------------------------------------------------------- the metrics


def scr_scores(accuracies: dict, clean: dict) -> dict[str, float]:
    """SAEBench's get_scr_plotting_dict."""
    biased = "male_professor / female_nurse"
    dir1_acc = clean[f"{biased} probe on professor / nurse data"]
    dir2_acc = clean[f"{biased} probe on male / female data"]
    out = {}
    for direction, ablated, data in ((1, "male / female", "professor / nurse"), (2, "professor / nurse",
                                                                                  "male / female")):
        for n in accuracies[ablated]:
            clean_acc, original = clean[data], clean[f"{biased} probe on {data} data"]
            changed = accuracies[ablated][n][f"{biased} probe on {data} data"]
            score = 0 if clean_acc - original < 0.001 else (changed - original) / (clean_acc - original)
            out[f"scr_dir{direction}_threshold_{n}"] = score
            if (dir1_acc < dir2_acc and direction == 1) or (dir1_acc > dir2_acc and direction == 2):
                out[f"scr_metric_threshold_{n}"] = score
    return out


def tpp_scores(accuracies: dict, clean: dict) -> tuple[dict[str, float], dict[str, dict]]:
    """SAEBench's create_tpp_plotting_dict: (means over classes, per class)."""
    per_class = {}
    classes = list(clean)
    for name in classes:
        metrics = {}
        for n in accuracies[name]:
            intended = clean[name] - accuracies[name][n][name]
            unintended = [clean[o] - accuracies[name][n][o] for o in classes if o != name]
            mean_unintended = sum(unintended) / len(unintended)
            metrics[f"tpp_threshold_{n}_total_metric"] = intended - mean_unintended
            metrics[f"tpp_threshold_{n}_intended_diff_only"] = intended
            metrics[f"tpp_threshold_{n}_unintended_diff_only"] = mean_unintended
        per_class[name] = metrics
    keys = next(iter(per_class.values())).keys()
    return {k: sum(m[k] for m in per_class.values()) / len(per_class) for k in keys}, per_class


def average(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """SAEBench's average_results_dictionaries over the runs."""
    collected: dict[str, list[float]] = {}
    for metrics in results.values():
        for key, value in metrics.items():
            collected.setdefault(key, []).append(value)
    return {key: sum(values) / len(values) for key, values in collected.items()}


# ----------------------------------------------------------------------------- the evals


def check_inputs(sae, lm, hook: str, config: ScrTppConfig) -> None:
    from interp.hooks.lm import parse_hook_name
    from interp.names import LM

    config.check()
    if getattr(lm, "kind", None) != LM or getattr(lm, "tokenizer", None) is None:  # the protocol's kind
        raise ScrTppError("SCR and TPP are LM metrics: the model is not a language model")
    parse_hook_name(hook, lm.n_layers)
    if sae.cfg.d_in != lm.d_model:
        raise ScrTppError(f"the SAE reads d_in={sae.cfg.d_in} but {lm.name} has d_model={lm.d_model} at {hook}")
    if max(config.n_values) > sae.cfg.d_sae:
        raise ScrTppError(f"n_values holds {max(config.n_values)}, more than the SAE's {sae.cfg.d_sae} latents")


def _float_sae(sae):
    return sae.astype("float32") if sae.W_enc.dtype != torch.float32 else sae


def _run_one(sae, lm, hook, train_sets, test_sets, config, classes, say):
    say(f"activations of {sum(map(len, train_sets.values()))} train and {sum(map(len, test_sets.values()))} test texts")
    train_BLD = {k: token_activations(lm, hook, v, config.context_length, config.llm_batch_size)
                 for k, v in train_sets.items()}
    test_BLD = {k: token_activations(lm, hook, v, config.context_length, config.llm_batch_size)
                for k, v in test_sets.items()}
    width = max(x.shape[1] for x in [*train_BLD.values(), *test_BLD.values()])  # one width: sets are concatenated
    train_BLD = {k: torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[1])) for k, x in train_BLD.items()}
    test_BLD = {k: torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[1])) for k, x in test_BLD.items()}
    train_mean = {k: meaned(v) for k, v in train_BLD.items()}
    test_mean = {k: meaned(v) for k, v in test_BLD.items()}
    say("probes")
    probes = train_probes(train_mean, test_mean, config)
    clean = test_accuracies(probes, classes, test_mean, config.probe_test_batch_size, config.perform_scr)
    say("latent effects and ablations")
    effects = {c: latent_effects(sae, probes[c], c, train_BLD, config.perform_scr, config.sae_batch_size)
               for c in classes}
    return ablation_accuracies(probes, sae, test_BLD, effects, config, classes), clean


def _start(sae, lm, hook: str, records, config: ScrTppConfig | None, scr: bool, progress):
    """What SCR and TPP share before their first probe: (config, say, the float SAE, the records by class), the
    inputs checked and the random generators seeded as SAEBench seeds them."""
    config = config or ScrTppConfig()
    config.perform_scr = scr
    check_inputs(sae, lm, hook, config)
    random.seed(config.random_seed)
    torch.manual_seed(config.random_seed)
    split = _by_class(records, random.Random(config.random_seed))
    return config, progress or (lambda message: None), _float_sae(sae), split


def run_scr(sae, lm, hook: str, records: list[tuple[str, str]], config: ScrTppConfig | None = None,
            progress=None, dataset_name: str = DATASET_NAME) -> tuple[dict, list[dict]]:
    """SCR -> ({"scr_metrics": {...}}, [per class pair: {"dataset_name", ...}])."""
    config, say, sae, split = _start(sae, lm, hook, records, config, True, progress)
    pairs = config.column1_vals_lookup.get(dataset_name) or []
    if not pairs:
        raise ScrTppError(f"column1_vals_lookup names no class pair for {dataset_name}")
    for a, b in pairs:
        for label in (a, b):
            if label not in split:
                raise ScrTppError(f"the dataset has no class {label!r}; it has: {', '.join(split)}")
    results = {}
    for a, b in pairs:
        say(f"pair {a} / {b}")
        train_sets = spurious_sets(split[a][0], split[b][0], config.train_set_size // 4, config.random_seed, "train")
        test_sets = spurious_sets(split[a][1], split[b][1], config.test_set_size // 4, config.random_seed, "test")
        accuracies, clean = _run_one(sae, lm, hook, train_sets, test_sets, config, list(PAIRED_CLASS_KEYS), say)
        results[f"{dataset_name}_scr_{a}_{b}_results"] = scr_scores(accuracies, clean)
    metrics = {"scr_metrics": average(results)}
    details = [{"dataset_name": name, **scores} for name, scores in results.items()]
    return metrics, details


def run_tpp(sae, lm, hook: str, records: list[tuple[str, str]], config: ScrTppConfig | None = None,
            progress=None, dataset_name: str = DATASET_NAME) -> tuple[dict, list[dict]]:
    """TPP -> ({"tpp_metrics": {...}}, [{"dataset_name", ...}])."""
    config, say, sae, split = _start(sae, lm, hook, records, config, False, progress)
    classes = [c for c in config.tpp_classes if c in split] if config.tpp_classes else list(split)
    missing = [c for c in config.tpp_classes if c not in split]
    if missing:
        raise ScrTppError(f"the dataset has no class {', '.join(map(repr, missing))}; it has: {', '.join(split)}")
    if len(classes) < 2:
        raise ScrTppError("TPP needs at least two classes")
    # per class: two of SAEBench's quadrants (train_set_size // 4 texts each), as its Bias in Bios TPP sets
    per_train, per_test = config.train_set_size // 2, config.test_set_size // 2
    short = [c for c in classes if len(split[c][0]) < per_train or len(split[c][1]) < per_test]
    if per_train < 1 or per_test < 1 or short:
        raise ScrTppError(f"class(es) {', '.join(short) or 'all'} have fewer than {per_train} train / {per_test} "
                          f"test texts: lower train_set_size / test_set_size")
    train_sets = {c: split[c][0][:per_train] for c in classes}
    test_sets = {c: split[c][1][:per_test] for c in classes}
    accuracies, clean = _run_one(sae, lm, hook, train_sets, test_sets, config, classes, say)
    overall, per_class = tpp_scores(accuracies, clean)
    name = f"{dataset_name}_tpp_results"
    metrics = {"tpp_metrics": average({name: overall})}
    details = [{"dataset_name": name, **overall}]
    return metrics, details
