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
        residual = capture_residuals(lm, ids, mask, [hook])[hook]           # (b, width, d)
        latents = sae.encode(residual[keep].to(sae.W_enc.dtype)).float()    # (kept, F)
        if not torch.isfinite(latents).all():
            raise ValueError(f"the SAE's activations at {hook} hold NaN or Inf")
        b_idx, t_idx = keep.nonzero(as_tuple=True)
        flat = torch.from_numpy(starts[which[b_idx.numpy()]]) + t_idx       # flat token index of each kept row
        nz_row, nz_feat = latents.nonzero(as_tuple=True)
        rows.append(flat[nz_row].numpy())
        feats.append(nz_feat.numpy().astype(np.int64))
        vals.append(latents[nz_row, nz_feat].numpy())
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


@torch.no_grad()
def logit_tokens(lm, sae: SAE, n: int = 10, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                             np.ndarray]:
    """(promoted ids, their logit effects, suppressed ids, theirs), each (d_sae, n): the tokens each
    feature's decoder direction raises / lowers most through the unembedding (`logit_effects`)."""
    from interp.hooks.lm_steer import logit_effects

    up_ids, up_vals, down_ids, down_vals = [], [], [], []
    for first in range(0, sae.cfg.d_sae, batch_size):
        effects = logit_effects(lm, sae.W_dec[first:first + batch_size])   # (b, vocab)
        k = min(n, effects.shape[1])
        up, down = effects.topk(k, dim=1), effects.topk(k, dim=1, largest=False)
        up_ids.append(up.indices.numpy())
        up_vals.append(up.values.numpy())
        down_ids.append(down.indices.numpy())
        down_vals.append(down.values.numpy())
    return (np.concatenate(up_ids), np.concatenate(up_vals), np.concatenate(down_ids), np.concatenate(down_vals))


def _r(value: float, digits: int = 4) -> float:
    return float(round(float(value), digits))


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
    document_of = np.searchsorted(acts.starts, acts.rows, side="right") - 1
    order = np.lexsort((-acts.values, acts.features))              # by feature, largest activation first
    group_starts = np.concatenate([[0], np.cumsum(counts)])
    up_ids, up_vals, down_ids, down_vals = logits
    vocabulary = sorted({int(i) for i in np.concatenate([up_ids.ravel(), down_ids.ravel()])})
    names = dict(zip(vocabulary, token_strings(tokenizer, vocabulary)))
    windows: dict[tuple[int, int, int], list[str]] = {}
    cards = []
    for f in range(n_features):
        group = order[group_starts[f]:group_starts[f + 1]]
        card = {"id": f, "frequency": _r(counts[f] / max(acts.counted, 1), 6),
                "mean_activation": _r(sums[f] / counts[f]) if counts[f] else 0.0,
                "max_activation": _r(maxima[f]), "n_firing": int(counts[f]),
                "histogram": {"edges": [_r(e) for e in np.linspace(0.0, maxima[f], bins + 1)],
                              "counts": [int(c) for c in histogram[f]]},
                "top_contexts": [],
                "promoted": [{"token": names[int(i)], "id": int(i), "logit": _r(v)}
                             for i, v in zip(up_ids[f], up_vals[f])],
                "suppressed": [{"token": names[int(i)], "id": int(i), "logit": _r(v)}
                               for i, v in zip(down_ids[f], down_vals[f])]}
        if len(group):
            _, first_of_doc = np.unique(document_of[group], return_index=True)  # each document's largest
            best = group[np.sort(first_of_doc)][:config.n_top_contexts]
            best = best[np.argsort(-acts.values[best], kind="stable")]
            rows_f, values_f = acts.rows[group], acts.values[group]
            for entry in best:
                doc = int(document_of[entry])
                start = int(acts.starts[doc])
                position = int(acts.rows[entry]) - start
                lo = max(0, position - config.window_before)
                hi = min(len(acts.sequences[doc]), position + config.window_after + 1)
                inside = (rows_f >= start + lo) & (rows_f < start + hi)
                window = np.zeros(hi - lo)
                window[rows_f[inside] - start - lo] = values_f[inside]
                if (doc, lo, hi) not in windows:  # the window's own text: a few decodes, not the sequence's
                    windows[doc, lo, hi] = sequence_pieces(tokenizer, acts.sequences[doc][lo:hi])
                card["top_contexts"].append({
                    "sequence": doc, "position": position, "activation": _r(acts.values[entry]),
                    "start": lo, "tokens": windows[doc, lo, hi], "activations": [_r(v) for v in window],
                    "highlight": position - lo})
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
                   sae_dir: str | os.PathLike | None = None, overwrite: bool = False) -> dict:
    """Cards of every feature of an SAE on an LM hook over a corpus; writes features.json and
    features.html into out_dir and returns the features.json payload."""
    from interp.hooks.lm_steer import check_sae_fits

    config = (config or LMAnalysisConfig()).validate()
    out_dir = Path(out_dir)
    if not overwrite:
        refuse_shipped([out_dir], "saes features", ANALYSE_ELSEWHERE)
    hook = check_sae_fits(lm, sae, where=f"the SAE{f' in {sae_dir}' if sae_dir else ''}")
    from interp.lm_text import read_documents

    documents = read_documents(corpus_path)
    sequences = tokenize_corpus(lm.tokenizer, documents, config.tokens, min(config.max_length, lm.n_ctx))
    acts = encode_corpus(lm, sae, hook, sequences, config.batch_size)
    cards = feature_cards(acts, lm.tokenizer, logit_tokens(lm, sae, config.n_logit_tokens), config)
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
    config = LMAnalysisConfig(tokens=args.tokens, n_top_contexts=args.top)
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


__all__ = ["LMAnalysisConfig", "analyse_lm_sae", "card_html", "encode_corpus", "feature_cards",
           "lm_features_command", "load_lm_cards", "logit_tokens", "render_html", "sae_hook_name",
           "tokenize_corpus"]


def features_command(args) -> int:
    """`python -m saes features`: a language model's SAEs here (cards over --text), any other in
    `saes.features.image_features_command` (cards over an image pool)."""
    from .features import image_features_command

    if args.text is not None or any(saved_kind(path) == LM for path in args.sae):
        return lm_features_command(args)
    return image_features_command(args)
