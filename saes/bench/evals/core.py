"""SAEBench's core eval (sae_bench/evals/core/main.py, 0.6.0) on a CPU: every metric, in its formulas.

On held-out text cut into whole-document sequences (interp.lm_text.token_sequences, at most --context tokens,
each led by the start token), per batch of sequences:

    clean     the model as it is; the residual at the SAE's hook is recorded
    spliced   the residual replaced by sae.decode(sae.encode(x)) at every position whose token is not special
              (SAEBench's exclude_special_tokens_from_reconstruction; on by default here, see below)
    ablated   the residual replaced by zeros at every position (SAEBench's zero ablation)

Metrics follow SAEBench 0.6.0 line by line, with its token mask (positions whose token is the tokenizer's pad, eos
or bos token are left out; ignore_tokens in its multiple_evals), also where its formula is odd:

    ce_loss_score = (CE_ablated - CE_sae) / (CE_ablated - CE_clean)    CE per position i predicting token i+1
    kl_div_score  = (KL_ablated - KL_sae) / KL_ablated                 KL(clean || other) per position
    l0, l1        mean per token of #(latents != 0) and of sum(latents)
    l2_ratio      mean per token of ||x_hat|| / ||x|| (||x|| < 1e-4 counted as 1); l2_norm_in / _out their means
    relative_reconstruction_bias   per batch mean ||x_hat||^2 / mean <x, x_hat>, averaged over batches
    cossim        mean per token of cos(x, x_hat)
    mse           mean per token of ||x - x_hat||^2 / (the batch's token count)     [SAEBench's formula, sic]
                  (batches: 2048 kept tokens, SAEBench's default 16 x 128, whatever the forward passes' lengths)
    explained_variance   1 - E||x - x_hat||^2 / (E||x||^2 - (mean_d E[x_d^2])^2)    [SAEBench 0.6.0's formula, sic]
    explained_variance_legacy   mean per token of 1 - ||x - x_hat||^2 / ||x - batch mean||^2
    feature density, consistent_activation_heuristic (firings / prompts it fires in), frac_alive,
    freq_over_1/10_percent (and normalised), per-feature encoder norm / bias, encoder-decoder cosine, max cosine
    to any other encoder / decoder row and their averages.

Two of SAEBench 0.6.0's formulas are not what their names say: `mse` divides each token's squared error by the
batch's token count, and `explained_variance`'s denominator subtracts the square of the mean *second moment*,
not the mean. They are kept as SAEBench computes them (so that the numbers sit on SAEBench's plots), and the
textbook figures (per-element MSE, 1 - FVU, from saes.evaluate's definitions) go in eval_result_unstructured.

Positions: SAEBench splices at every position unless told to exclude special tokens; the SAEs here never see the
start token (every store leaves it out: an attention sink, with a residual norm far above the rest on SmolLM2),
so `exclude_special_tokens_from_reconstruction` defaults to True (the config records it; `--option
exclude_special_tokens_from_reconstruction=false` gives SAEBench's default).
"""

from __future__ import annotations

import math

import torch

from ..registry import BenchOptions, EvalResult, EvalType, made_in_the_chat_world, register_eval

EVAL_TYPE_ID = "core"
FLOAT_DIGITS = 6  # SAEBench rounds per-feature details to DEFAULT_FLOAT_PRECISION (6)
# SAEBench's default batch: 16 prompts x 128 tokens. Its per-batch formulas (mse divides by the batch's token
# count; relative_reconstruction_bias and explained_variance average per-batch figures) see batches of this many
# tokens here too, whatever the lengths of the forward passes' sequences.
METRIC_BATCH_TOKENS = 16 * 128


# ----------------------------------------------------------------------------- weight-based metrics

def max_cosine_similarity(vectors_DF: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """(F,): each column's largest cosine similarity with any other column (chunked: no F x F matrix)."""
    unit = torch.nn.functional.normalize(vectors_DF.float(), p=2, dim=0)
    n = unit.shape[1]
    out = torch.empty(n)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        sims = unit[:, start:end].t() @ unit
        sims[torch.arange(end - start), torch.arange(start, end)] = float("-inf")
        out[start:end] = sims.max(dim=1).values
    return out


@torch.no_grad()
def weight_metrics(sae) -> dict[str, list[float]]:
    """Per-feature: encoder norm and bias, encoder-decoder cosine, max cosine to another encoder / decoder row."""
    W_enc, W_dec = sae.W_enc.float(), sae.W_dec.float()  # (d_in, d_sae), (d_sae, d_in)
    encoder_decoder = torch.nn.functional.cosine_similarity(W_dec, W_enc.t(), dim=1)
    return {
        "encoder_bias": sae.b_enc.float().tolist(),
        "encoder_norm": W_enc.norm(dim=0).tolist(),
        "encoder_decoder_cosine_sim": encoder_decoder.tolist(),
        "max_encoder_cosine_sim": max_cosine_similarity(W_enc).tolist(),
        "max_decoder_cosine_sim": max_cosine_similarity(W_dec.t()).tolist(),
    }


def misc_metrics(feature: dict[str, list[float]]) -> dict[str, float]:
    """SAEBench's calculate_misc_metrics: averages of the max cosines, alive fraction, frequent-feature shares."""
    density = torch.tensor(feature["feature_density"], dtype=torch.float32)
    total = density.sum()
    return {
        "freq_over_1_percent": (density > 0.01).float().mean().item(),
        "freq_over_10_percent": (density > 0.1).float().mean().item(),
        "normalized_freq_over_1_percent": (density[density > 0.01].sum() / total).item() if total > 0 else 0.0,
        "normalized_freq_over_10_percent": (density[density > 0.1].sum() / total).item() if total > 0 else 0.0,
        "average_max_encoder_cosine_sim": torch.tensor(feature["max_encoder_cosine_sim"]).mean().item(),
        "average_max_decoder_cosine_sim": torch.tensor(feature["max_decoder_cosine_sim"]).mean().item(),
        "frac_alive": (density > 0).float().mean().item(),
    }


# ----------------------------------------------------------------------------- activation-based metrics

class CoreAccumulator:
    """SAEBench's per-batch lists and running sums, fed one batch at a time (so no token's activations are kept
    beyond its batch); `metrics()` aggregates them as SAEBench does."""

    def __init__(self, d_sae: int, chunk_tokens: int | None = None):
        self.chunk_tokens = chunk_tokens
        self.buffer: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.buffered = 0
        self.per_token = {k: [] for k in ("l2_norm_in", "l2_norm_out", "l2_ratio", "l0", "l1",
                                          "explained_variance_legacy", "mse", "cossim",
                                          "kl_div_with_sae", "kl_div_with_ablation",
                                          "ce_loss_with_sae", "ce_loss_without_sae", "ce_loss_with_ablation")}
        self.per_batch_rrb: list[torch.Tensor] = []
        self.mean_sum_sq: list[torch.Tensor] = []
        self.mean_sq_per_dim: list[torch.Tensor] = []
        self.mean_resid_sq: list[torch.Tensor] = []
        self.feature_acts = torch.zeros(d_sae, dtype=torch.float64)
        self.feature_prompts = torch.zeros(d_sae, dtype=torch.float64)
        self.tokens = 0
        # textbook figures (saes.evaluate's definitions), over the same tokens
        self.sum_x = None
        self.sum_x_sq = 0.0
        self.sum_err_sq = 0.0
        self.d_in = None

    def add_activations(self, x: torch.Tensor, latents: torch.Tensor, x_hat: torch.Tensor,
                        keep: torch.Tensor) -> None:
        """x, x_hat: (batch, pos, d_in) float32; latents (batch, pos, d_sae); keep (batch, pos) bool: the tokens
        SAEBench counts (not pad / eos / bos, and inside the sequence). Per-feature counts are taken per sequence
        here; the formula metrics per SAEBench batch (`chunk_tokens` kept tokens, or this forward batch)."""
        xs, xh, acts = x[keep], x_hat[keep], latents[keep]
        n = xs.shape[0]
        if n == 0:
            return
        fired = (latents > 0) & keep.unsqueeze(-1)
        self.feature_acts += fired.sum(dim=(0, 1)).double()
        self.feature_prompts += (fired.sum(dim=1) > 0).sum(0).double()
        self.tokens += n
        xd = xs.double()
        self.sum_x = xd.sum(0) if self.sum_x is None else self.sum_x + xd.sum(0)
        self.sum_x_sq += float(xd.pow(2).sum())
        self.sum_err_sq += float((xs - xh).double().pow(2).sum())
        self.d_in = xs.shape[1]
        if self.chunk_tokens is None:
            self._batch(xs, xh, acts)
            return
        self.buffer.append((xs, xh, acts))
        self.buffered += n
        while self.buffered >= 2 * self.chunk_tokens:  # one full batch stays back for the end (see metrics)
            self._flush(self.chunk_tokens)

    def _flush(self, size: int) -> None:
        xs, xh, acts = (torch.cat(parts) for parts in zip(*self.buffer))
        self._batch(xs[:size], xh[:size], acts[:size])
        rest = (xs[size:], xh[size:], acts[size:])
        self.buffer = [rest] if len(rest[0]) else []
        self.buffered = len(rest[0])

    def _batch(self, xs: torch.Tensor, xh: torch.Tensor, acts: torch.Tensor) -> None:
        """One SAEBench batch of kept tokens (n, d): its per-token values and per-batch sums, as
        get_sparsity_and_variance_metrics computes them."""
        n = xs.shape[0]
        norm_in, norm_out = xs.norm(dim=-1), xh.norm(dim=-1)
        safe_in = norm_in.clone()
        safe_in[safe_in.abs() < 1e-4] = 1
        self.per_token["l2_norm_in"].append(norm_in)
        self.per_token["l2_norm_out"].append(norm_out)
        self.per_token["l2_ratio"].append(norm_out / safe_in)
        self.per_batch_rrb.append((norm_out.pow(2).mean() / (xs * xh).sum(-1).mean()).reshape(1))
        self.per_token["l0"].append((acts != 0).sum(-1).float())
        self.per_token["l1"].append(acts.sum(-1))
        resid_sq = (xs - xh).pow(2).sum(-1)
        self.per_token["mse"].append(resid_sq / n)
        centred = (xs - xs.mean(0)).pow(2).sum(-1)
        self.per_token["explained_variance_legacy"].append(1 - resid_sq / centred)
        self.mean_sum_sq.append(xs.pow(2).sum(-1).mean(0))
        self.mean_sq_per_dim.append(xs.pow(2).mean(0))
        self.mean_resid_sq.append(resid_sq.mean(0))
        cos = (xs / xs.norm(dim=-1, keepdim=True) * (xh / xh.norm(dim=-1, keepdim=True))).sum(-1)
        self.per_token["cossim"].append(cos)

    def add_losses(self, name: str, values: torch.Tensor) -> None:
        self.per_token[name].append(values.float())

    def metrics(self) -> tuple[dict, dict, dict]:
        """(SAEBench's metric categories, per-feature density lists, the textbook figures)."""
        if self.chunk_tokens is not None and self.buffered >= self.chunk_tokens + 2:
            self._flush(self.chunk_tokens)
        if self.buffered:  # the last batch; a remainder of 1 token joins the batch before it (a batch of one token
            self._flush(self.buffered)  # has no variance: its legacy EV would be -inf)
        mean = {k: torch.cat(v).mean().item() for k, v in self.per_token.items() if v}
        mean["relative_reconstruction_bias"] = torch.cat(self.per_batch_rrb).mean().item()
        total_variance = (torch.stack(self.mean_sum_sq).mean(0)
                          - torch.cat(self.mean_sq_per_dim).mean(0) ** 2)
        mean["explained_variance"] = (1 - torch.stack(self.mean_resid_sq).mean(0) / total_variance).item()
        kl_gap = mean["kl_div_with_ablation"]
        ce_gap = mean["ce_loss_with_ablation"] - mean["ce_loss_without_sae"]
        if abs(kl_gap) < 1e-12 or abs(ce_gap) < 1e-12:
            raise ValueError("zero-ablating the hook changes nothing on these tokens (no KL or CE gap): the KL and "
                             "CE scores are undefined; score more tokens (--n-tokens) or another hook")
        mean["kl_div_score"] = (kl_gap - mean["kl_div_with_sae"]) / kl_gap
        mean["ce_loss_score"] = (mean["ce_loss_with_ablation"] - mean["ce_loss_with_sae"]) / ce_gap
        density = (self.feature_acts / self.tokens).tolist()
        consistent = (self.feature_acts / self.feature_prompts).tolist()  # NaN for a dead feature, as SAEBench
        variance_sum = self.sum_x_sq - float(self.sum_x.pow(2).sum()) / self.tokens
        textbook = {"explained_variance_1_minus_fvu": 1 - self.sum_err_sq / max(variance_sum, 1e-12),
                    "mse_per_element": self.sum_err_sq / (self.tokens * self.d_in)}
        return mean, {"feature_density": density, "consistent_activation_heuristic": consistent}, textbook


def special_token_ids(tokenizer) -> set[int]:
    """SAEBench's ignore_tokens: the pad, eos and bos ids (those the tokenizer has)."""
    return {int(t) for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
            if t is not None}


def _logits(lm, ids, mask):
    if lm.backend == "transformer_lens":
        return lm.model(ids, attention_mask=mask)
    return lm.model(input_ids=ids, attention_mask=mask).logits


@torch.no_grad()
def core_batch(lm, sae, hook: str, ids: torch.Tensor, mask: torch.Tensor, special: set[int],
               acc: CoreAccumulator, exclude_special: bool = True) -> None:
    """One batch (ids, attention mask: (batch, pos)) into the accumulator: three forward passes."""
    from interp.hooks.lm import residual_capture
    from interp.hooks.lm_splice import residual_replacement

    ids, mask = ids.to(lm.device), mask.to(lm.device)
    is_special = torch.zeros_like(ids, dtype=torch.bool)
    for token in special:
        is_special |= ids == token
    valid = mask.bool()
    keep = valid & ~is_special                  # SAEBench's mask: not pad / eos / bos (and not padding)
    splice_at = ~is_special if exclude_special else torch.ones_like(keep)

    with residual_capture(lm, [hook]) as capture:
        clean = _logits(lm, ids, mask).float().log_softmax(-1)
    x = capture.activations[hook].float()
    latents = sae.encode(x)
    x_hat = sae.decode(latents).float()
    acc.add_activations(x, latents.float(), x_hat, keep)

    def spliced(resid):
        return torch.where(splice_at.unsqueeze(-1), sae.decode(sae.encode(resid)).to(resid.dtype), resid)

    with residual_replacement(lm, hook, spliced, start=0):
        with_sae = _logits(lm, ids, mask).float().log_softmax(-1)
    with residual_replacement(lm, hook, torch.zeros_like, start=0):
        ablated = _logits(lm, ids, mask).float().log_softmax(-1)

    p_clean = clean.exp()
    for name, logp in (("kl_div_with_sae", with_sae), ("kl_div_with_ablation", ablated)):
        acc.add_losses(name, (p_clean * (clean - logp)).sum(-1)[keep])
    # CE at position i predicts token i + 1; counted where token i is kept and token i + 1 is in the sequence
    targets = ids[:, 1:]
    ce_keep = keep[:, :-1] & valid[:, 1:]
    for name, logp in (("ce_loss_without_sae", clean), ("ce_loss_with_sae", with_sae),
                       ("ce_loss_with_ablation", ablated)):
        ce = -logp[:, :-1].gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        acc.add_losses(name, ce[ce_keep])


def held_out_documents(options: BenchOptions, tokenizer) -> tuple[list[str], str]:
    """(documents, where they came from): --text, or for the embedded chat models the chat world's held-out
    conversations (rendered by the model's chat template): the held-out set saes/pretrained/toy-chat/ship.sh
    evaluates the shipped SAE on."""
    from interp.lm_text import read_documents

    if options.text is not None:
        return read_documents(options.text), str(options.text)
    if made_in_the_chat_world(options.model_name):
        from zoo.chat.world import World, WorldConfig

        rows = World(WorldConfig(seed=0)).mixture("held_out", 2000, {"general": 0.6, "harmful": 0.2, "benign": 0.2},
                                                   seed=7)
        docs = []
        for row in rows:
            chat = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
            text = tokenizer.apply_chat_template(chat, tokenize=False)
            if tokenizer.bos_token and text.startswith(tokenizer.bos_token):
                text = text[len(tokenizer.bos_token):]
            docs.append(text)
        return docs, "chat world held_out split (2000 conversations, seed 7: toy-chat ship.sh's heldout.jsonl)"
    raise ValueError(f"the core eval needs held-out text for {options.model_name}: pass --text FILE (JSONL or "
                     f"lines; see docs/saebench.md)")


def token_batches(lm, documents: list[str], context: int, n_tokens: int, batch_size: int):
    """Right-padded (ids, mask) batches of whole-document sequences, up to n_tokens tokens in all, sorted by
    length (SAEBench's batches are all full; its per-batch mse and relative_reconstruction_bias see like rows)."""
    from interp.hooks.lm import right_padded
    from interp.lm_text import token_sequences

    sequences, total = [], 0
    for seq in token_sequences(lm.tokenizer, documents, min(context, lm.n_ctx)):
        if len(seq) < 3:
            continue
        seq = seq[:max(3, n_tokens - total)]
        sequences.append(seq)
        total += len(seq)
        if total >= n_tokens:
            break
    if not sequences:
        raise ValueError("the held-out text has no sequence of at least 3 tokens")
    sequences.sort(key=len)  # batches of like lengths: little padding to compute
    return [right_padded(lm, sequences[i:i + batch_size]) for i in range(0, len(sequences), batch_size)], total


def compute_core(lm, sae, hook: str, batches, exclude_special: bool = True, progress: bool = False,
                 chunk_tokens: int | None = None) -> tuple:
    """(metric categories, per-feature details, textbook figures) on the given (ids, mask) batches. SAEBench's
    per-batch formulas (mse, relative_reconstruction_bias, explained_variance) group `chunk_tokens` kept tokens
    at a time (None: each forward batch, as SAEBench's own batches are)."""
    special = special_token_ids(lm.tokenizer)
    acc = CoreAccumulator(sae.cfg.d_sae, chunk_tokens)
    iterator = batches
    if progress:
        from tqdm import tqdm

        iterator = tqdm(batches, desc="core", unit="batch")
    for ids, mask in iterator:
        core_batch(lm, sae, hook, ids, mask, special, acc, exclude_special)
    if acc.tokens == 0:
        raise ValueError("no token of the held-out text is left once pad / eos / bos tokens are set aside")
    m, feature, textbook = acc.metrics()
    feature.update(weight_metrics(sae))
    n_tokens = int(sum(int(mask.sum()) for _, mask in batches))
    categories = {
        "model_behavior_preservation": {k: m[k] for k in ("kl_div_score", "kl_div_with_ablation", "kl_div_with_sae")},
        "model_performance_preservation": {k: m[k] for k in ("ce_loss_score", "ce_loss_with_ablation",
                                                             "ce_loss_with_sae", "ce_loss_without_sae")},
        "reconstruction_quality": {k: m[k] for k in ("explained_variance", "explained_variance_legacy", "mse",
                                                     "cossim")},
        "shrinkage": {k: m[k] for k in ("l2_norm_in", "l2_norm_out", "l2_ratio", "relative_reconstruction_bias")},
        "sparsity": {k: m[k] for k in ("l0", "l1")},
        "token_stats": {"total_tokens_eval_reconstruction": n_tokens, "total_tokens_eval_sparsity_variance": n_tokens},
        "misc_metrics": misc_metrics(feature),
    }
    textbook["tokens_counted"] = acc.tokens
    return categories, feature, textbook


def _clean(value: float) -> float:
    """SAEBench's replace_nans_with_negative_one, and its 6-digit rounding of per-feature numbers."""
    return -1 if isinstance(value, float) and math.isnan(value) else round(value, FLOAT_DIGITS)


def feature_details(feature: dict[str, list[float]]) -> list[dict]:
    names = ("feature_density", "consistent_activation_heuristic", "encoder_bias", "encoder_norm",
             "encoder_decoder_cosine_sim", "max_decoder_cosine_sim", "max_encoder_cosine_sim")
    return [{"index": i, **{name: _clean(feature[name][i]) for name in names}}
            for i in range(len(feature["feature_density"]))]


def _check(sae, lm, options: BenchOptions) -> None:
    held_out_documents(options, lm.tokenizer)  # a missing or empty file fails here, before any forward pass
    _exclude(options)


def _exclude(options: BenchOptions) -> bool:
    value = options.get("exclude_special_tokens_from_reconstruction", True)
    if not isinstance(value, bool):
        raise ValueError(f"option exclude_special_tokens_from_reconstruction must be true or false, got {value!r}")
    return value


def run_core(sae, lm, options: BenchOptions) -> EvalResult:
    documents, source = held_out_documents(options, lm.tokenizer)
    batches, _ = token_batches(lm, documents, options.context_size, options.n_tokens, options.batch_size)
    exclude = _exclude(options)
    sae = sae.to(lm.device)
    categories, feature, textbook = compute_core(lm, sae, options.hook, batches, exclude, options.progress,
                                                 chunk_tokens=METRIC_BATCH_TOKENS)
    config = {
        "model_name": options.model_name, "llm_dtype": options.dtype, "batch_size_prompts": options.batch_size,
        "n_eval_reconstruction_batches": len(batches), "n_eval_sparsity_variance_batches": len(batches),
        "dataset": source, "context_size": min(options.context_size, lm.n_ctx),
        "compute_kl": True, "compute_ce_loss": True, "compute_l2_norms": True, "compute_sparsity_metrics": True,
        "compute_variance_metrics": True, "compute_featurewise_density_statistics": True,
        "compute_featurewise_weight_based_metrics": True,
        "exclude_special_tokens_from_reconstruction": exclude, "verbose": False,
    }
    unstructured = {"textbook": textbook, "metric_batch_tokens": METRIC_BATCH_TOKENS,
                    "note": "explained_variance and mse use SAEBench 0.6.0's formulas (see saes/bench/evals/core.py); "
                            "textbook.explained_variance_1_minus_fvu and textbook.mse_per_element are the usual ones"}
    return EvalResult(config, categories, feature_details(feature), unstructured)


CORE = register_eval(EvalType(
    name="core", eval_type_id=EVAL_TYPE_ID, run=run_core, kinds=("lm",), check=_check,
    options=("exclude_special_tokens_from_reconstruction",),
    description="SAEBench core: KL / CE scores, reconstruction, shrinkage, sparsity, feature density and geometry"))

__all__ = ["CORE", "CoreAccumulator", "compute_core", "core_batch", "feature_details", "max_cosine_similarity",
           "misc_metrics", "special_token_ids", "token_batches", "weight_metrics"]
