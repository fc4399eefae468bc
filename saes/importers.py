"""Import of the published SDXL Turbo SAEs (openai/sparse_autoencoder layout) into our format.

A published checkpoint directory holds `state_dict.pth` (a TopK autoencoder: `pre_bias`
(d_in,), `latent_bias` (d_sae,), `encoder.weight` (d_sae, d_in), `decoder.weight`
(d_in, d_sae), optionally `stats_last_nonzero`), usually `config.json` (`k`, `d_model`,
`n_dirs_local`, ...) and per-feature `mean.pt` / `std.pt` (activation statistics; the mean is
the natural edit strength). It is read with torch.load(weights_only=True): tensors only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from interp.cli import add_out_argument

from .sae import SAE, SAEConfig, SAEFormatError, check_finite

SDXL_TURBO_K = 10


def _load_tensor_file(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpickling error means something other than plain tensors
        raise SAEFormatError(f"{path} could not be read as tensors (weights_only=True): {err}") from err


def import_openai_topk(checkpoint: str | Path, k: int | None = None, **metadata) -> SAE:
    """checkpoint: a state_dict.pth file or the directory holding it -> a topk `SAE`.
    k is the argument, else config.json's beside it, else SDXL Turbo's 10. Weights holding NaN or
    infinities are refused."""
    checkpoint = Path(checkpoint)
    directory = checkpoint if checkpoint.is_dir() else checkpoint.parent
    weights_path = directory / "state_dict.pth" if checkpoint.is_dir() else checkpoint
    if not weights_path.is_file():
        raise SAEFormatError(f"no state_dict.pth at {checkpoint}")
    state = _load_tensor_file(weights_path)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    required = ("pre_bias", "latent_bias", "encoder.weight", "decoder.weight")
    missing = [key for key in required if key not in state]
    if missing:
        raise SAEFormatError(f"{weights_path} lacks {missing}; an openai-layout TopK SAE has {list(required)}")
    check_finite({key: state[key] for key in required}, str(weights_path))
    encoder, decoder = state["encoder.weight"].float(), state["decoder.weight"].float()
    d_sae, d_in = encoder.shape
    if decoder.shape != (d_in, d_sae):
        raise SAEFormatError(f"decoder.weight has shape {tuple(decoder.shape)}, expected {(d_in, d_sae)}")
    config_path = directory / "config.json"
    if k is None and config_path.is_file():
        k = json.loads(config_path.read_text()).get("k")
    k = int(SDXL_TURBO_K if k is None else k)
    sae = SAE(SAEConfig(architecture="topk", d_in=d_in, d_sae=d_sae, k=k,
                        metadata={"imported_from": str(weights_path), **metadata}))
    with torch.no_grad():
        sae.W_enc.copy_(encoder.t())
        sae.b_enc.copy_(state["latent_bias"].float())
        sae.W_dec.copy_(decoder.t())
        sae.b_dec.copy_(state["pre_bias"].float())
    for name, attribute in (("mean.pt", "feature_mean"), ("std.pt", "feature_std")):
        path = directory / name
        if path.is_file():
            values = _load_tensor_file(path)
            if not isinstance(values, torch.Tensor) or values.shape != (d_sae,):
                raise SAEFormatError(f"{path} should hold one value per feature, shape ({d_sae},)")
            setattr(sae, attribute, values.float())
    return sae


def add_import_sdxl_arguments(parser) -> None:
    """`saes import-sdxl`: the published checkpoint and where its sae-lens directory goes."""
    parser.add_argument("--checkpoint", required=True, help="state_dict.pth or its directory (with mean.pt / std.pt)")
    add_out_argument(parser, required=True)
    parser.add_argument("--block", default=None, help="block name to record, e.g. unet.down_blocks.2.attentions.1")
    parser.add_argument("--k", type=int, default=None, help="default: config.json beside it, else 10")


def import_sdxl_command(args) -> int:
    metadata = {"hook_name": args.block} if args.block else {}
    sae = import_openai_topk(args.checkpoint, k=args.k, **metadata)
    sae.save(args.out)
    print(f"wrote {args.out} (topk, d_in={sae.cfg.d_in}, d_sae={sae.cfg.d_sae}, k={sae.cfg.k})")
    return 0
