"""Feature cards of SAEs on language-model residual streams: what each feature fires on in a text
corpus and which next tokens it pushes up or down.

For an SAE trained at a residual hook (``metadata.hook_name`` = ``blocks.{l}.hook_resid_post`` etc.)
and a corpus, per feature:

    frequency        share of the corpus' tokens where the feature fires (latent > 0)
    mean_activation  mean latent where it fires (the natural unit of steering strength), max_activation
    histogram        counts of its non-zero activations in equal bins from 0 to its maximum
    top_contexts     the sequences where it fires most (one context per sequence), each with the token at its maximum and a
                     window around it, every token with the feature's activation there
    promoted         the 10 tokens whose logits its decoder direction raises most through the
    suppressed       model's own final norm and output head (linearised: `interp.hooks.lm_steer.logit_effects`),
                     and the 10 it lowers most
    logit_histogram  its logit effects on every token of the vocabulary in SAEDashboard's histogram (50 equal bins
                     from the lowest to the highest: bar centres ``values``, counts ``heights``), for the exports

The corpus is read and cut into sequences as for collection and evaluation (`interp.lm_text`: JSONL
with Dolly's ``instruction``/``context``/``response``, ``text`` or ``prompt`` + ``completion``, or plain
text lines; each sequence a start token and at most ``max_length - 1`` tokens of one document). The
start token's position is left out of the statistics, as collection leaves it out (an attention
sink, far from every other position's stream). Written as ``features.json`` (strict JSON, atomic; the card fields ``id``, ``frequency`` and
``mean_activation`` are those of the image cards in `saes.probes`) and ``features.html`` (a
self-contained page), beside the SAE unless told otherwise:

    python -m saes features --sae runs/lm-sae/blocks.2.hook_resid_post --model toy-chat --text corpus.jsonl
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from html import escape
from pathlib import Path

import numpy as np
import torch

from interp.atomic import atomic_write_text
from interp.cli import LM_DTYPE, dtype_name, parse_dtype
from interp.hooks.lm_steer import is_residual_hook
from interp.models.spec import LM, saved_kind
from interp.models.spec import saved_hook_name as sae_hook_name  # what an SAE directory reads (named here too)
from interp.shipped import refuse_shipped

from .features import ANALYSE_ELSEWHERE, HTML_FILENAME
from .pool import FEATURES_FILENAME
from .sae import CFG_FILENAME, SAE
from .strict_json import write_json

KIND = LM  # features.json's "kind": cards over a text corpus, not an image pool


@dataclass
class LMAnalysisConfig:
    """How LM features are analysed; plain values, saved with the cards."""

    tokens: int = 20_000          # corpus tokens analysed (sequences are taken in order until this many)
    max_length: int = 1024        # tokens per sequence (the model's context if smaller): whole documents, mostly;
                                  # a window that starts mid-document can hold an attention sink at position 1
                                  # (SmolLM2: norm about 11,000 against 170) whose activations would top the cards
    batch_size: int = 16          # sequences per forward pass
    n_top_contexts: int = 6
    window_before: int = 12       # tokens shown before the top token of a context
    window_after: int = 4
    histogram_bins: int = 16
    n_logit_tokens: int = 10      # promoted and suppressed tokens per feature
    html_max_features: int = 256  # cards on the HTML page (live features, most frequent first)

    def validate(self) -> "LMAnalysisConfig":
        for name, value in asdict(self).items():
            minimum = 0 if name in ("window_before", "window_after") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be a whole number of at least {minimum}, got {value!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- which SAEs

def _dirs_under(path: Path) -> list[Path]:
    return [path] if (path / CFG_FILENAME).is_file() else sorted(p.parent for p in path.glob(f"*/{CFG_FILENAME}"))


def lm_sae_dirs(paths) -> list[Path]:
    """The SAE directories named by --sae: SAE directories, or directories of them."""
    dirs = []
    for path in map(Path, paths):
        found = _dirs_under(path)
        if not found:
            raise ValueError(f"{path} is not an SAE directory (no {CFG_FILENAME}) nor a directory of them")
        dirs += found
    return dirs


# ----------------------------------------------------------------------------- the corpus

def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tokenize_corpus(tokenizer, documents: list[str], n_tokens: int, context: int) -> list[list[int]]:
    """The corpus' first sequences (`interp.lm_text.token_sequences`: a start token and at most
    context - 1 tokens of one document each), until n_tokens tokens in all (the last one cut)."""
    from interp.lm_text import token_sequences

    out, total = [], 0
    for ids in token_sequences(tokenizer, documents, context):
        ids = ids[:n_tokens - total]
        if len(ids) > 1:
            out.append(ids)
            total += len(ids)
        if total >= n_tokens:
            break
    if not out:
        raise ValueError("the corpus gives no tokens")
    return out


# ----------------------------------------------------------------------------- analysis

@dataclass
class Activations:
    """The non-zero activations of every feature over a tokenized corpus (sparse, all of them)."""

    sequences: list[list[int]]   # token ids per sequence
    starts: np.ndarray           # (sequences + 1,) index of each sequence's first token in the flat corpus
    rows: np.ndarray             # (nnz,) flat token index
    features: np.ndarray         # (nnz,) feature index
    values: np.ndarray           # (nnz,) activation, > 0
    counted: int                 # tokens counted in the statistics (start tokens left out)
    d_sae: int


ENCODE_ROWS = 2048  # token rows encoded at once: (rows, d_sae) pre-activations, 128 MiB at 16,384 latents


def _nonzero_latents(sae: SAE, x: torch.Tensor, hook: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row, feature, value) of every non-zero latent of x (rows, d_in), in row-major order (row, then feature). A
    TopK SAE encodes sparsely (its k largest pre-activations, those above 0: the non-zero entries of `encode`)."""
    x = x.to(sae.W_enc.dtype)
    if sae.cfg.architecture == "topk":
        values, indices = sae.encode_sparse(x)
        values = values.float()
        if not torch.isfinite(values).all():
            raise ValueError(f"the SAE's activations at {hook} hold NaN or Inf")
        indices, by_feature = indices.sort(dim=1)
        values = values.gather(1, by_feature)
        row, slot = (values > 0).nonzero(as_tuple=True)
        return row, indices[row, slot], values[row, slot]
    latents = sae.encode(x).float()
    if not torch.isfinite(latents).all():
        raise ValueError(f"the SAE's activations at {hook} hold NaN or Inf")
    row, feat = latents.nonzero(as_tuple=True)
    return row, feat, latents[row, feat]


@torch.no_grad()
def encode_corpus(lm, sae: SAE, hook: str, sequences: list[list[int]], batch_size: int = 16) -> Activations:
    """Run the sequences through the model, capture ``hook`` and encode it with the SAE."""
    from interp.hooks.lm import capture_residuals

    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    lengths = np.array([len(d) for d in sequences])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows, feats, vals, counted = [], [], [], 0
    by_length = np.argsort(lengths, kind="stable")  # batches of like lengths: little padding
    for first in range(0, len(sequences), batch_size):
        which = by_length[first:first + batch_size]
        chunk = [sequences[i] for i in which]
        width = max(map(len, chunk))
        ids = torch.tensor([d + [pad] * (width - len(d)) for d in chunk])
        mask = torch.tensor([[1] * len(d) + [0] * (width - len(d)) for d in chunk])
        keep = mask.bool()
        keep[:, 0] = False  # the start token: an attention sink, left out as collection leaves it out
        residual = capture_residuals(lm, ids, mask, [hook])[hook][keep]     # (kept, d)
        b_idx, t_idx = keep.nonzero(as_tuple=True)
        flat = torch.from_numpy(starts[which[b_idx.numpy()]]) + t_idx       # flat token index of each kept row
        for lo in range(0, len(residual), ENCODE_ROWS):                     # (rows, F) latents: bounded memory
            row, feat, val = _nonzero_latents(sae, residual[lo:lo + ENCODE_ROWS], hook)
            rows.append(flat[lo:lo + ENCODE_ROWS][row].numpy())
            feats.append(feat.numpy().astype(np.int64))
            vals.append(val.numpy())
        counted += int(keep.sum())
    return Activations(sequences, starts, np.concatenate(rows), np.concatenate(feats), np.concatenate(vals),
                       counted, sae.cfg.d_sae)


def token_strings(tokenizer, ids) -> list[str]:
    """Each id decoded alone (leading spaces kept), so tokens can be shown one by one."""
    cache: dict[int, str] = {}
    out = []
    for i in ids:
        i = int(i)
        if i not in cache:
            cache[i] = tokenizer.decode([i])
        out.append(cache[i])
    return out


def sequence_pieces(tokenizer, ids) -> list[str]:
    """The text each token adds to the tokens before it (so that joined they read as ``decode(ids)``: the
    spaces a word-level or byte-level tokenizer puts between tokens included); a token whose text does not
    extend the decoded prefix (special tokens, split characters) is decoded alone."""
    pieces, before = [], ""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end])
        pieces.append(text[len(before):] if text.startswith(before) else tokenizer.decode(ids[end - 1:end]))
        before = text
    return pieces


class PieceDecoder:
    """`sequence_pieces` of many windows with few decodes. A window whose tokens each decode alone to clean text
    (no U+FFFD: whole UTF-8 characters) and whose one decode is those texts joined has, under a tokenizer that
    cleans up no spaces, those texts as its pieces: every prefix then decodes to the join of its tokens' texts
    (a byte-level decoder concatenates the tokens' bytes). Any other window (a character split across tokens, a
    word-level tokenizer that joins with spaces, one that cleans up spaces) takes `sequence_pieces`' token-by-token
    decodes. `tests/test_lm_features.py` checks both against `sequence_pieces` on real text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.alone: dict[int, str] = {}
        self.fast = not getattr(tokenizer, "clean_up_tokenization_spaces", False)

    def __call__(self, ids: list[int]) -> list[str]:
        if self.fast:
            alone = self.alone
            texts = []
            for i in ids:
                text = alone.get(i)
                if text is None:
                    text = alone[i] = self.tokenizer.decode([i])
                texts.append(text)
            if not any("\ufffd" in t for t in texts) and "".join(texts) == self.tokenizer.decode(ids):
                return texts
        return sequence_pieces(self.tokenizer, ids)


def _first_per_group(keys: np.ndarray) -> np.ndarray:
    """Positions where a run of equal keys starts, in a key array sorted so that equal keys are adjacent."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))


@torch.no_grad()
def logit_tokens(lm, sae: SAE, n: int = 10, batch_size: int = 256, histogram_bins: int = 0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                                     np.ndarray, list]:
    """(promoted ids, their logit effects, suppressed ids, theirs), each (d_sae, n): the tokens each
    feature's decoder direction raises / lowers most through the unembedding (`logit_effects`). With
    ``histogram_bins``, also each feature's histogram of its effects on the whole vocabulary (SAEDashboard's:
    `saes.export.histogram`, (bar centres, bar heights)) from the same pass, which the exports read from the cards."""
    from interp.hooks.lm_steer import logit_effects

    from .export import histogram

    up_ids, up_vals, down_ids, down_vals, histograms = [], [], [], [], []
    for first in range(0, sae.cfg.d_sae, batch_size):
        effects = logit_effects(lm, sae.W_dec[first:first + batch_size])   # (b, vocab)
        k = min(n, effects.shape[1])
        up, down = effects.topk(k, dim=1), effects.topk(k, dim=1, largest=False)
        up_ids.append(up.indices.numpy())
        up_vals.append(up.values.numpy())
        down_ids.append(down.indices.numpy())
        down_vals.append(down.values.numpy())
        if histogram_bins:
            histograms += [histogram(row, histogram_bins) for row in effects]
    out = (np.concatenate(up_ids), np.concatenate(up_vals), np.concatenate(down_ids), np.concatenate(down_vals))
    return out + (histograms,) if histogram_bins else out


def _r(value: float, digits: int = 4) -> float:
    return float(round(float(value), digits))


def top_contexts(acts: Activations, document_of: np.ndarray, order: np.ndarray, n_top: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's top contexts at once: (entries, features), the entries (indices into acts) of every feature's
    largest activation in each sequence, the n_top largest of those per feature (ties: the earlier entry in
    `order`), grouped by feature and largest first. `order`: the entries by feature, largest activation first."""
    f_sorted, d_sorted = acts.features[order], document_of[order]
    key = f_sorted * (len(acts.starts) + 1) + d_sorted
    grouped = np.argsort(key, kind="stable")                     # (feature, sequence) runs, each in `order`'s order
    best = np.sort(grouped[_first_per_group(key[grouped])])      # each run's first: its largest; back in `order`
    features = f_sorted[best]
    rank = np.arange(len(best)) - np.searchsorted(features, features, side="left")
    keep = rank < n_top
    return order[best[keep]], features[keep]


def window_values(acts: Activations, features: np.ndarray, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray
                  ) -> np.ndarray:
    """Each window's activations of its feature, concatenated: feature f at flat tokens start + lo .. start + hi."""
    widths = hi - lo
    total = int(widths.sum())
    first = np.repeat(np.cumsum(widths) - widths, widths)
    flat = np.repeat(starts + lo, widths) + (np.arange(total) - first)
    wanted = flat * acts.d_sae + np.repeat(features, widths)
    have = acts.rows.astype(np.int64) * acts.d_sae + acts.features
    by_key = np.argsort(have)
    at = np.minimum(np.searchsorted(have, wanted, sorter=by_key), max(len(have) - 1, 0))
    out = np.zeros(total)
    if len(have):
        hit = have[by_key[at]] == wanted
        out[hit] = acts.values[by_key[at[hit]]]
    return out


def all_top_contexts(acts: Activations, tokenizer, config: LMAnalysisConfig) -> list[list[dict]]:
    """Every feature's top contexts (the cards' ``top_contexts``), found for all features at once over the sparse
    activations (`top_contexts`, `window_values`), each window's text decoded once (`PieceDecoder`)."""
    document_of = np.searchsorted(acts.starts, acts.rows, side="right") - 1
    order = np.lexsort((-acts.values, acts.features))              # by feature, largest activation first
    entries, entry_features = top_contexts(acts, document_of, order, config.n_top_contexts)
    docs = document_of[entries]
    starts = acts.starts[docs].astype(np.int64)
    positions = acts.rows[entries].astype(np.int64) - starts
    lengths = np.array([len(s) for s in acts.sequences])[docs]
    lo = np.maximum(0, positions - config.window_before)
    hi = np.minimum(lengths, positions + config.window_after + 1)
    values = window_values(acts, entry_features, starts, lo, hi)
    offsets = np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64).tolist()
    per_feature = np.concatenate([[0], np.cumsum(np.bincount(entry_features, minlength=acts.d_sae))]).tolist()
    pieces = PieceDecoder(tokenizer)
    windows: dict[tuple[int, int, int], list[str]] = {}
    docs, positions, lo, hi = docs.tolist(), positions.tolist(), lo.tolist(), hi.tolist()
    if acts.values.dtype.itemsize <= 4:
        # float32 values times 10^4 are exact in float64 (24 + 10 bits), so numpy's rint(x * 10^4) / 10^4 is the
        # correctly rounded result that `_r`'s round(x, 4) gives, ties to even included
        values = np.round(values, 4).tolist()
    else:
        values = [round(v, 4) for v in values.tolist()]
    tops = acts.values[entries].tolist()
    out = []
    for f in range(acts.d_sae):
        contexts = []
        for n in range(per_feature[f], per_feature[f + 1]):
            doc, a, b = docs[n], lo[n], hi[n]
            tokens = windows.get((doc, a, b))
            if tokens is None:  # the window's own text: a decode or two, not the sequence's
                tokens = windows[doc, a, b] = pieces(acts.sequences[doc][a:b])
            contexts.append({"sequence": doc, "position": positions[n], "activation": _r(tops[n]), "start": a,
                             "tokens": tokens, "activations": values[offsets[n]:offsets[n + 1]],
                             "highlight": positions[n] - a})
        out.append(contexts)
    return out


def feature_cards(acts: Activations, tokenizer, logits, config: LMAnalysisConfig) -> list[dict]:
    """One card per feature, ordered by id (see the module's docstring for the fields)."""
    n_features = acts.d_sae
    counts = np.bincount(acts.features, minlength=n_features)
    sums = np.bincount(acts.features, weights=acts.values, minlength=n_features)
    maxima = np.zeros(n_features)
    np.maximum.at(maxima, acts.features, acts.values)
    bins = config.histogram_bins
    scaled = acts.values / np.maximum(maxima[acts.features], 1e-12)
    which = np.minimum((scaled * bins).astype(np.int64), bins - 1)
    histogram = np.bincount(acts.features * bins + which, minlength=n_features * bins).reshape(n_features, bins)
    up_ids, up_vals, down_ids, down_vals = logits[:4]
    logit_histograms = logits[4] if len(logits) > 4 else None
    vocabulary = sorted({int(i) for i in np.concatenate([up_ids.ravel(), down_ids.ravel()])})
    names = dict(zip(vocabulary, token_strings(tokenizer, vocabulary)))
    contexts = all_top_contexts(acts, tokenizer, config)
    cards = []
    for f in range(n_features):
        card = {"id": f, "frequency": _r(counts[f] / max(acts.counted, 1), 6),
                "mean_activation": _r(sums[f] / counts[f]) if counts[f] else 0.0,
                "max_activation": _r(maxima[f]), "n_firing": int(counts[f]),
                "histogram": {"edges": [_r(e) for e in np.linspace(0.0, maxima[f], bins + 1)],
                              "counts": [int(c) for c in histogram[f]]},
                "top_contexts": contexts[f],
                "promoted": [{"token": names[int(i)], "id": int(i), "logit": _r(v)}
                             for i, v in zip(up_ids[f], up_vals[f])],
                "suppressed": [{"token": names[int(i)], "id": int(i), "logit": _r(v)}
                               for i, v in zip(down_ids[f], down_vals[f])]}
        if logit_histograms is not None:
            card["logit_histogram"] = {"values": logit_histograms[f][0], "heights": logit_histograms[f][1]}
        cards.append(card)
    return cards


# ----------------------------------------------------------------------------- HTML

CSS = ("body{font-family:sans-serif;margin:1em;max-width:1100px}.card{border:1px solid #ccc;border-radius:6px;"
       "margin:8px 0;padding:8px}.head{font-weight:bold}.meta{color:#555;font-size:12px}"
       ".ctx{font-family:monospace;font-size:13px;white-space:pre-wrap;margin:3px 0;padding:2px 4px;"
       "background:#fafafa;border-left:3px solid #ddd}.tok{border-radius:2px}.top{outline:2px solid #c60;"
       "font-weight:bold}.logits{font-family:monospace;font-size:12px}.up{color:#063}.down{color:#900}"
       ".hist{vertical-align:middle}")


def _visible(token: str) -> str:
    return token.replace("\n", "\u21b5\n").replace("\t", "\u21e5")


def context_html(context: dict, scale: float) -> str:
    """One context: each token shaded by the feature's activation there (title: the value)."""
    spans = []
    for i, (token, value) in enumerate(zip(context["tokens"], context["activations"])):
        alpha = min(1.0, value / scale) if scale > 0 else 0.0
        style = f" style='background:rgba(255,140,0,{alpha:.2f})'" if value > 0 else ""
        cls = "tok top" if i == context["highlight"] else "tok"
        spans.append(f"<span class='{cls}'{style} title='{value:.3f}'>{escape(_visible(token))}</span>")
    return (f"<div class='ctx' title='sequence {context['sequence']}, token {context['position']}, "
            f"activation {context['activation']:.3f}'>{''.join(spans)}</div>")


def histogram_svg(histogram: dict, width: int = 160, height: int = 36) -> str:
    counts = histogram["counts"]
    top = max(counts) or 1
    bar = width / max(len(counts), 1)
    rects = "".join(f"<rect x='{i * bar:.1f}' y='{height - height * c / top:.1f}' width='{bar - 1:.1f}' "
                    f"height='{height * c / top:.1f}' fill='#c60'/>" for i, c in enumerate(counts) if c)
    edges = histogram["edges"]
    title = f"activations from 0 to {edges[-1]:.3f} in {len(counts)} bins: {counts}"
    return (f"<svg class='hist' width='{width}' height='{height}' role='img'><title>{escape(title)}</title>"
            f"<rect width='{width}' height='{height}' fill='#f4f4f4'/>{rects}</svg>")


def card_html(card: dict) -> str:
    """One feature card as an HTML fragment (the page's and the UI's)."""
    scale = card.get("max_activation") or 1.0
    up = " ".join(f"<span class='up' title='{t['logit']:+.3f}'>{escape(repr(t['token']))}</span>"
                  for t in card["promoted"])
    down = " ".join(f"<span class='down' title='{t['logit']:+.3f}'>{escape(repr(t['token']))}</span>"
                    for t in card["suppressed"])
    contexts = "".join(context_html(c, scale) for c in card["top_contexts"]) or \
        "<div class='meta'>never fires on the corpus</div>"
    return (f"<div class='card' id='f{card['id']}'><div class='head'>#{card['id']}</div>"
            f"<div class='meta'>fires on {100 * card['frequency']:.3f}% of tokens ({card['n_firing']}), mean "
            f"activation {card['mean_activation']:.3f}, max {card['max_activation']:.3f} "
            f"{histogram_svg(card['histogram'])}</div>"
            f"<div class='logits'>promotes: {up}</div><div class='logits'>suppresses: {down}</div>{contexts}</div>")


def render_html(payload: dict, max_features: int = 256) -> str:
    """A self-contained page of a features.json payload: live features, most frequent first."""
    cards = payload["features"]
    live = sorted((c for c in cards if c["n_firing"] > 0), key=lambda c: (-c["frequency"], c["id"]))
    shown = live[:max_features]
    corpus = payload["corpus"]
    title = f"{payload['hook']} of {payload['model']}"
    return "\n".join([
        f"<!doctype html><html><head><meta charset='utf-8'><title>SAE features: {escape(title)}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>SAE features: {escape(title)}</h1>",
        f"<p class='meta'>{len(cards)} features, {len(live)} fire on {corpus['tokens']} tokens of "
        f"{corpus['sequences']} sequences of {escape(corpus['path'])}; showing {len(shown)}, most frequent first. "
        f"Tokens are shaded by the feature's activation (hover for the value); the outlined token is the "
        f"context's maximum. Promoted / suppressed: the next tokens whose logits the decoder direction raises / "
        f"lowers most through the unembedding.</p>",
        *[card_html(c) for c in shown],
        "</body></html>"])


# ----------------------------------------------------------------------------- the whole command

def analyse_lm_sae(lm, sae: SAE, corpus_path: str | os.PathLike, out_dir: str | os.PathLike,
                   config: LMAnalysisConfig | None = None, model_name: str | None = None,
                   sae_dir: str | os.PathLike | None = None, overwrite: bool = False, timings: dict | None = None,
                   keep: dict | None = None) -> dict:
    """Cards of every feature of an SAE on an LM hook over a corpus; writes features.json and
    features.html into out_dir and returns the features.json payload. ``timings``, when given, receives each
    stage's wall time and this process' CPU time in seconds (``{stage}_s``, ``{stage}_cpu_s``: corpus, encode,
    logits, cards, write); ``keep`` receives the stages' inputs
    (``acts``, ``logits``) for a benchmark to rerun a stage on."""
    import time

    from interp.hooks.lm_steer import check_sae_fits

    config = (config or LMAnalysisConfig()).validate()
    out_dir = Path(out_dir)
    if not overwrite:
        refuse_shipped([out_dir], "saes features", ANALYSE_ELSEWHERE)
    hook = check_sae_fits(lm, sae, where=f"the SAE{f' in {sae_dir}' if sae_dir else ''}")
    from interp.lm_text import read_documents

    from .export import LOGITS_HIST_BINS

    timings = {} if timings is None else timings
    clock = (time.perf_counter(), time.process_time())

    def lap(stage: str) -> None:
        nonlocal clock
        now = (time.perf_counter(), time.process_time())
        timings[f"{stage}_s"], timings[f"{stage}_cpu_s"] = round(now[0] - clock[0], 2), round(now[1] - clock[1], 2)
        clock = now

    documents = read_documents(corpus_path)
    sequences = tokenize_corpus(lm.tokenizer, documents, config.tokens, min(config.max_length, lm.n_ctx))
    lap("corpus")
    acts = encode_corpus(lm, sae, hook, sequences, config.batch_size)
    lap("encode")
    logits = logit_tokens(lm, sae, config.n_logit_tokens, histogram_bins=LOGITS_HIST_BINS)
    lap("logits")
    cards = feature_cards(acts, lm.tokenizer, logits, config)
    lap("cards")
    payload = {"kind": KIND, "block": hook, "hook": hook, "model": model_name or lm.name,
               "sae": str(sae_dir) if sae_dir is not None else None,
               "corpus": {"path": Path(corpus_path).name, "sha256": file_sha256(corpus_path),
                          "documents": len(documents),
                          "sequences": len(sequences), "tokens": int(acts.starts[-1]), "counted_tokens": acts.counted},
               "config": config.to_dict(), "model_dtype": dtype_name(next(lm.model.parameters()).dtype),
               "features": cards}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / FEATURES_FILENAME, payload, separators=(",", ":"))
    atomic_write_text(out_dir / HTML_FILENAME, render_html(payload, config.html_max_features))
    lap("write")
    if keep is not None:
        keep.update(acts=acts, logits=logits)
    return payload


def load_lm_cards(directory: str | os.PathLike) -> dict | None:
    """The LM feature cards in a directory (features.json with kind "lm"), or None when there are none."""
    path = Path(directory) / FEATURES_FILENAME
    if not path.is_file():
        return None
    payload = json.loads(path.read_text())
    return payload if payload.get("kind") == KIND else None


def lm_features_command(args) -> int:
    """`python -m saes features --sae DIR --model NAME --text FILE [--tokens N] [--out DIR]`."""
    from interp.models.lm import load_lm

    if args.text is None:
        raise ValueError("SAEs on a language model's residual stream are analysed on text: give --text FILE "
                         "(JSONL with text or instruction/context/response fields, or plain text lines)")
    if args.store is not None or args.world is not None:
        raise ValueError("--store and --world are image sources; an LM SAE is analysed on --text FILE")
    sae_dirs = lm_sae_dirs(args.sae)
    saes = [(d, SAE.load(d).eval()) for d in sae_dirs]
    not_lm = [str(d) for d, s in saes if not is_residual_hook(s.cfg.metadata.get("hook_name"))]
    if not_lm:
        raise ValueError(f"{', '.join(not_lm)}: not an SAE on a language-model residual hook "
                         f"(metadata.hook_name must be blocks.<l>.hook_resid_pre|mid|post); analyse image SAEs "
                         f"with --store or --world, apart from LM SAEs")
    model = args.model
    if model in (None, "toy"):  # the image side's default: take the model the SAE was trained on
        recorded = {s.cfg.metadata.get("model_name") for _, s in saes} - {None}
        if len(recorded) != 1:
            raise ValueError("give --model NAME, the language model the SAE reads (its cfg.json names none)")
        model = recorded.pop()
    config = LMAnalysisConfig(tokens=args.tokens, n_top_contexts=args.top,
                              max_length=getattr(args, "max_length", LMAnalysisConfig.max_length))
    out_dirs = [Path(args.out) / d.name if args.out and len(sae_dirs) > 1 else Path(args.out or d)
                for d in sae_dirs]
    if not args.overwrite:
        refuse_shipped(out_dirs, "saes features", ANALYSE_ELSEWHERE)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_lm(model, backend=getattr(args, "backend", "hf"), dtype=parse_dtype(getattr(args, "dtype", None), default=LM_DTYPE))
    for (directory, sae), out in zip(saes, out_dirs):
        payload = analyse_lm_sae(lm, sae, args.text, out, config, model_name=args.model_name or model,
                                 sae_dir=directory, overwrite=args.overwrite)
        live = sum(c["n_firing"] > 0 for c in payload["features"])
        print(f"{payload['hook']}: {live} of {len(payload['features'])} features fire on "
              f"{payload['corpus']['tokens']} tokens of {payload['corpus']['sequences']} sequences; wrote "
              f"{out / FEATURES_FILENAME} and {out / HTML_FILENAME}")
    return 0


__all__ = ["LMAnalysisConfig", "PieceDecoder", "all_top_contexts", "analyse_lm_sae", "card_html", "encode_corpus",
           "feature_cards", "lm_features_command", "load_lm_cards", "logit_tokens", "render_html", "sae_hook_name",
           "tokenize_corpus"]


def features_command(args) -> int:
    """`python -m saes features`: a language model's SAEs here (cards over --text), any other in
    `saes.features.image_features_command` (cards over an image pool)."""
    from .features import image_features_command

    if args.text is not None or any(saved_kind(path) == LM for path in args.sae):
        return lm_features_command(args)
    return image_features_command(args)
