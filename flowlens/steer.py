"""Steering a language model by one SAE feature: its greedy completion without and with the edit.

    python -m flowlens steer --model toy-chat --sae runs/lm-sae/blocks.2.hook_resid_post --feature 12 \\
        --strength 40 --prompt "What colour is the sky?"

The edit is an `interp.hooks.lm_steer.LMEdit` at the hook the SAE was trained on (its cfg.json's
``metadata.hook_name``), applied during `greedy_generate` in this context only. This module reads
SAE directories through `saes.sae.SAE` (imported inside the functions: flowlens -> saes, see
ARCHITECTURE.md's arrows).
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
from pathlib import Path

from interp.cli import LM_DTYPE, add_backend_argument, add_dtype_argument, at_least, parse_dtype

DEFAULT_MAX_NEW_TOKENS = 32


def load_lm_sae(path: str | Path):
    """(the SAE in directory ``path``, the residual hook it reads), checked to be an SAE on an LM hook."""
    from interp.hooks.lm_steer import is_residual_hook
    from saes.sae import SAE

    sae = SAE.load(path).eval()
    hook = sae.cfg.metadata.get("hook_name")
    if not hook:
        raise ValueError(f"the SAE in {path} does not say which hook it reads (no metadata.hook_name in its "
                         f"cfg.json); steering needs blocks.<l>.hook_resid_post or another residual hook")
    if not is_residual_hook(hook):
        raise ValueError(f"the SAE in {path} reads {hook!r}, not a language-model residual hook "
                         f"(blocks.<l>.hook_resid_pre|mid|post): it is not an LM SAE")
    return sae, hook


def check_feature(sae, feature) -> int:
    n = sae.cfg.d_sae
    if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < n:
        raise ValueError(f"feature {feature} is out of range: the SAE has {n} features, 0 to {n - 1}")
    return feature


def make_edit(hook: str, feature: int, strength: float, mode: str = "add", positions: str = "all"):
    from interp.hooks.lm_steer import LMEdit

    return LMEdit(hook, mode, feature=feature, strength=strength, positions=positions)


def steer_comparison(lm, sae, hook: str, prompt: str, edit, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                     chat_template: bool | None = None, cancel=None) -> dict:
    """{"prompt", "edit", "without", "with"}: the greedy completion of ``prompt`` without and with ``edit``."""
    from interp.hooks.lm_steer import check_sae_fits, generate, validate_lm_edits

    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("the prompt is empty: give some text to continue")
    check_sae_fits(lm, sae, hook)
    saes = {hook: sae}
    validate_lm_edits(lm, [edit], saes)
    without = generate(lm, prompt, (), None, max_new_tokens, chat_template, cancel=cancel)[0]
    edited = generate(lm, prompt, [edit], saes, max_new_tokens, chat_template, cancel=cancel)[0]
    return {"prompt": prompt, "edit": edit.to_dict(), "without": without, "with": edited}


def side_by_side(left: str, right: str, width: int | None = None, titles=("without the edit", "with the edit")) -> str:
    """Two texts in two wrapped columns."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    column = max(20, (width - 3) // 2)
    lines_left = [line for part in (left or "(empty)").splitlines() or [""]
                  for line in textwrap.wrap(part, column) or [""]]
    lines_right = [line for part in (right or "(empty)").splitlines() or [""]
                   for line in textwrap.wrap(part, column) or [""]]
    rows = [f"{titles[0]:<{column}} | {titles[1]}", f"{'-' * column} | {'-' * column}"]
    for i in range(max(len(lines_left), len(lines_right))):
        a = lines_left[i] if i < len(lines_left) else ""
        b = lines_right[i] if i < len(lines_right) else ""
        rows.append(f"{a:<{column}} | {b}".rstrip())
    return "\n".join(rows)


def add_steer_arguments(parser: argparse.ArgumentParser) -> None:
    from interp.hooks.lm_steer import LM_EDIT_MODES, POSITIONS

    parser.add_argument("--model", required=True, help="toy-chat, smollm2-135m-instruct, a directory, ...")
    parser.add_argument("--sae", required=True, help="SAE directory (sae-lens format; metadata.hook_name "
                                                     "blocks.<l>.hook_resid_post or another residual hook)")
    parser.add_argument("--feature", type=int, required=True, help="SAE feature index")
    parser.add_argument("--strength", type=float, default=None,
                        help="add: times the decoder direction; scale: factor on the feature's activation; set: "
                             "the activation it gets (needed by all three); ablate takes none")
    parser.add_argument("--mode", choices=LM_EDIT_MODES, default="add")
    parser.add_argument("--positions", choices=POSITIONS, default="all",
                        help="which tokens the edit touches: the prompt's, the generated ones (from the second new "
                             "token on, as each is fed back in) or all")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=at_least(1, 4096), default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--no-chat-template", action="store_true",
                        help="continue the raw prompt (default: the tokenizer's chat template when it has one)")
    parser.add_argument("--threads", type=at_least(1), default=None)
    add_dtype_argument(parser)
    add_backend_argument(parser)


def steer_command(args) -> int:
    import math

    import torch

    from interp.models.lm import load_lm

    if not args.prompt.strip():
        raise ValueError("the prompt is empty: give some text to continue (--prompt TEXT)")
    if args.strength is None:
        if args.mode != "ablate":
            raise ValueError(f"a {args.mode} edit needs --strength S")
        args.strength = 0.0
    elif args.mode == "ablate":
        raise ValueError("an ablate edit takes no --strength (it removes the feature's contribution)")
    if not math.isfinite(args.strength):
        raise ValueError(f"--strength must be a finite number, got {args.strength}")
    sae, hook = load_lm_sae(args.sae)
    check_feature(sae, args.feature)
    edit = make_edit(hook, args.feature, args.strength, args.mode, args.positions)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_lm(args.model, backend=args.backend, dtype=parse_dtype(args.dtype, default=LM_DTYPE))
    result = steer_comparison(lm, sae, hook, args.prompt, edit, args.max_new_tokens,
                              False if args.no_chat_template else None)
    what = f"{args.mode} feature {args.feature}" + ("" if args.mode == "ablate" else f" (strength {args.strength:g})")
    print(f"model: {lm.name} ({args.dtype}, {args.backend})   SAE: {args.sae} ({hook}, {sae.cfg.d_sae} features)")
    print(f"edit: {what} at {hook}, positions: {args.positions}")
    print(f"prompt: {args.prompt}\n")
    print(side_by_side(result["without"], result["with"]))
    return 0


__all__ = ["add_steer_arguments", "check_feature", "load_lm_sae", "make_edit", "side_by_side", "steer_command",
           "steer_comparison"]
