"""How much of a language model an SAE keeps: next-token loss with the SAE spliced in at its hook.

On held-out text cut into sequences (interp.lm_text), three forward passes of each batch:

    clean      the model as it is
    spliced    the residual at the SAE's hook replaced by the SAE's reconstruction of it
    zero       the residual at that hook replaced by zeros (the floor)

and per scored token the cross-entropy of the next token, and the KL divergence of the spliced
(and zeroed) next-token distribution from the clean one, KL(clean || spliced). The replacement
starts at position 1: the start token's residual (an attention sink, left out of every store)
stays clean, so the scored tokens are the predictions made at positions 1 .. n - 2 of each
sequence, every one of them downstream of a replaced residual.

    loss_recovered = (ce_zero - ce_spliced) / (ce_zero - ce_clean)     1: the SAE loses nothing

Each replacement is a hook that lives for one forward pass (interp.hooks.lm_splice.residual_replacement).
The clean pass also records the residual at the hook, so `evaluate` gives explained variance, L0 and
dead latents on the same held-out tokens.
"""

from __future__ import annotations

import sys

import torch

from interp.cli import LM_DTYPE, parse_dtype

from .evaluate import evaluate, markdown_table, write_eval
from .sae import SAE


def check_sae_for_model(sae: SAE, lm, hook: str) -> None:
    """Clear errors for an SAE that cannot be spliced into `lm` at `hook`."""
    from interp.hooks.lm import parse_hook_name

    parse_hook_name(hook, lm.n_layers)  # the message lists the valid names
    if sae.cfg.d_in != lm.d_model:
        raise ValueError(f"the SAE reads d_in={sae.cfg.d_in} but {lm.name} has d_model={lm.d_model} at {hook}: "
                         f"it was trained on another model")


def _logits(lm, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    if lm.backend == "transformer_lens":
        return lm.model(ids, attention_mask=mask)
    from interp.hooks.lm_nnsight import call_model

    return call_model(lm.model, input_ids=ids, attention_mask=mask).logits


def scored_sequences(sequences: list[list[int]], max_tokens: int | None) -> list[list[int]]:
    """The sequences whose predictions at positions 1 .. n - 2 add up to `max_tokens` scored tokens (None:
    all); the last one is shortened to fit. Sequences of fewer than 3 tokens score nothing and are dropped."""
    out, left = [], max_tokens
    for seq in sequences:
        if len(seq) < 3:
            continue
        if left is not None:
            seq = seq[:left + 2]
            left -= len(seq) - 2
        out.append(seq)
        if left is not None and left <= 0:
            break
    return out


@torch.no_grad()
def splice_losses(lm, sae: SAE, hook: str, sequences: list[list[int]], batch_size: int = 8,
                  progress: bool = False) -> tuple[dict, list[torch.Tensor]]:
    """(metrics, the clean residuals at the hook of the scored positions as float32 batches)."""
    from interp.hooks.lm import residual_capture, right_padded
    from interp.hooks.lm_splice import residual_replacement

    check_sae_for_model(sae, lm, hook)
    if not sequences:
        raise ValueError("no sequence of at least 3 tokens to score")
    sae = sae.to(lm.device)
    sums = {"ce_clean": 0.0, "ce_spliced": 0.0, "ce_zero": 0.0, "kl_spliced": 0.0, "kl_zero": 0.0}
    n_scored = 0
    residuals: list[torch.Tensor] = []
    sequences = sorted(sequences, key=len)  # batches of like lengths: little padding (the sums do not care)
    starts = range(0, len(sequences), batch_size)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="splice loss", unit="batch")
    for start in starts:
        chunk = sequences[start:start + batch_size]
        ids, mask = right_padded(lm, chunk)
        # predictions at positions 1 .. n - 2 of each row: the target (next token) exists and is not padding
        scored = mask[:, 2:].bool().clone()
        scored = torch.cat([torch.zeros(len(chunk), 1, dtype=torch.bool), scored], dim=1)  # (batch, width - 1)
        targets = ids[:, 1:].to(lm.device)
        with residual_capture(lm, [hook]) as capture:
            clean = _logits(lm, ids, mask)[:, :-1].float().log_softmax(-1)
        kept = mask.bool().clone()
        kept[:, 0] = False
        residuals.append(capture.activations[hook][kept])
        with residual_replacement(lm, hook, lambda x: sae(x)):
            spliced = _logits(lm, ids, mask)[:, :-1].float().log_softmax(-1)
        with residual_replacement(lm, hook, torch.zeros_like):
            zero = _logits(lm, ids, mask)[:, :-1].float().log_softmax(-1)
        where = scored.to(lm.device)
        for name, logp in (("clean", clean), ("spliced", spliced), ("zero", zero)):
            ce = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            sums[f"ce_{name}"] += float(ce[where].double().sum())
        p_clean = clean.exp()
        for name, logp in (("spliced", spliced), ("zero", zero)):
            kl = (p_clean * (clean - logp)).sum(-1)
            sums[f"kl_{name}"] += float(kl[where].double().sum())
        n_scored += int(where.sum())
        del clean, spliced, zero, p_clean
    means = {name: value / n_scored for name, value in sums.items()}
    gap = means["ce_zero"] - means["ce_clean"]
    metrics = {
        "model": lm.name, "hook": hook, "scored_tokens": n_scored, "sequences": len(sequences),
        "ce_loss_clean": means["ce_clean"], "ce_loss_spliced": means["ce_spliced"], "ce_loss_zero": means["ce_zero"],
        "loss_recovered": (means["ce_zero"] - means["ce_spliced"]) / gap if abs(gap) > 1e-12 else None,
        "kl_clean_spliced": means["kl_spliced"], "kl_clean_zero": means["kl_zero"],
        "replaced_positions": "1 ..", "scored_positions": "predictions at 1 .. n - 2 (next token not padding)",
    }
    return metrics, residuals


def lm_table(rows: dict[str, dict]) -> str:
    lines = ["| SAE | scored tokens | CE clean | CE spliced | CE zero-ablated | loss recovered | KL(clean‖spliced) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        recovered = "n/a" if r["loss_recovered"] is None else f"{r['loss_recovered']:.3f}"
        lines.append(f"| {name} | {r['scored_tokens']} | {r['ce_loss_clean']:.4f} | {r['ce_loss_spliced']:.4f} | "
                     f"{r['ce_loss_zero']:.4f} | {recovered} | {r['kl_clean_spliced']:.4f} |")
    return "\n".join(lines) + "\n"


def wants_lm_eval(args) -> bool:
    """Whether `saes eval` is about a language model: --text, an LM --model, or an LM store."""
    from interp.models.spec import LM, model_spec, saved_kind

    if getattr(args, "text", None) is not None:
        return True
    if args.model is not None:
        return model_spec(args.model).is_lm
    return args.store is not None and saved_kind(args.store) == LM


def lm_eval_command(args) -> int:
    """`python -m saes eval --sae DIR [--store DIR] [--model NAME --text FILE [--tokens N]]`."""
    from interp.lm_text import read_documents, token_sequences

    sae = SAE.load(args.sae)
    trained_at = sae.cfg.metadata.get("hook_name")
    hook = args.block or trained_at
    if not hook:
        raise ValueError("the SAE does not name its hook (metadata.hook_name); pass --block blocks.L.hook_resid_post")
    if args.block and trained_at and args.block != trained_at:
        raise ValueError(f"the SAE was trained at {trained_at}, not {args.block}: drop --block, or pass the SAE's "
                         f"own hook")
    if (args.model is None) != (args.text is None):
        raise ValueError("the splice loss needs both --model NAME and --text FILE (held-out text)")
    if args.store is None and args.text is None:
        raise ValueError("give the activations to evaluate on: --store DIR (an LM store) and/or --model NAME --text FILE")
    result: dict = {"sae": str(args.sae), "block": hook}
    if args.store is not None:
        from interp.store import ActivationStore

        store = ActivationStore(args.store)
        if hook not in store.blocks:
            raise ValueError(f"hook {hook!r} is not in the store at {args.store}; it has: {', '.join(store.blocks)}")
        result.update(evaluate(sae, store.batches(hook, batch_size=args.batch_size, shuffle=False),
                               max_tokens=args.tokens))
        result["source"] = f"store {args.store}"
    if args.text is not None:
        from interp.models.lm import load_lm

        torch.set_num_threads(args.threads)
        documents = read_documents(args.text)  # bad files fail before the model loads
        lm = load_lm(args.model, backend=getattr(args, "backend", "hf"), device=getattr(args, "device", None) or "cpu",
                     dtype=parse_dtype(args.dtype, default=LM_DTYPE))
        check_sae_for_model(sae, lm, hook)
        recorded = sae.cfg.metadata.get("model_name")
        if recorded and recorded != args.model:
            print(f"note: the SAE was trained on {recorded}; measuring it on {args.model}", file=sys.stderr)
        sequences = scored_sequences(token_sequences(lm.tokenizer, documents, min(args.context, lm.n_ctx)),
                                     args.tokens)
        metrics, residuals = splice_losses(lm, sae, hook, sequences, batch_size=args.sequences_per_batch,
                                           progress=True)
        metrics.update(text=str(args.text), context=min(args.context, lm.n_ctx), model_dtype=args.dtype or "float32")
        if args.tokens is not None and metrics["scored_tokens"] < args.tokens:
            metrics["note"] = f"{args.text} has only {metrics['scored_tokens']} tokens to score, fewer than --tokens"
            print(f"note: {metrics['note']}", file=sys.stderr)
        result["lm_splice"] = metrics
        if args.store is None:  # reconstruction metrics on the held-out residuals themselves
            result.update(evaluate(sae, residuals))
            result["source"] = f"text {args.text}"
    table = markdown_table({hook: result})
    if "lm_splice" in result:
        table += "\n" + lm_table({hook: result["lm_splice"]})
    write_eval(args.sae, args.out, result, table, overwrite=args.overwrite)
    return 0


__all__ = ["check_sae_for_model", "lm_eval_command", "lm_table", "scored_sequences", "splice_losses", "wants_lm_eval"]


def eval_command(args) -> int:
    """`python -m saes eval`: a language model's SAE here (splice loss on --text, EV on an LM store), any other in
    `saes.evaluate.image_eval_command`."""
    from .evaluate import image_eval_command

    if wants_lm_eval(args):
        return lm_eval_command(args)
    return image_eval_command(args)
