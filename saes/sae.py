"""The inference SAE: encode, decode, decoder directions; saved and loaded in sae-lens' format.

Kept apart from training state (as sae-lens does) so that an intervention hook only needs
`encode` / `decode` on (positions, channels) tensors. Architectures:

    topk      latents = ReLU(TopK_k(pre))                       (our trainer, SDXL Turbo SAEs)
    jumprelu  latents = pre * (pre > threshold)                 (sae-lens JumpReLU; BatchTopK saves as this)
    standard  latents = ReLU(pre)                               (sae-lens L1 SAE)

with pre = (x - b_dec) @ W_enc + b_enc (b_dec subtracted only if apply_b_dec_to_input) and
reconstruction = latents @ W_dec + b_dec. Weight layout and file names are sae-lens':
W_enc (d_in, d_sae), b_enc (d_sae,), W_dec (d_sae, d_in), b_dec (d_in,), threshold (d_sae,).

A **transcoder** (``cfg.transcoder``) is the same encoder read from one site (an MLP's input) and a decoder
that writes another (the MLP's output): W_dec (d_sae, d_out), b_dec (d_out,), b_dec never subtracted from
the input, and with ``skip`` a linear skip path W_skip (d_out, d_in): output = decode(encode(x)) + x @ W_skip.T.
Its cfg.json carries sae-lens 6's names (`TRANSCODER_NAMES`): ``transcoder`` / ``skip_transcoder`` (ReLU),
``jumprelu_transcoder`` / ``jumprelu_skip_transcoder``, which sae-lens' ``SAE.load_from_disk`` loads; a TopK
transcoder is ``topk_transcoder`` / ``topk_skip_transcoder``, a name sae-lens 6 does not have (it has no TopK
transcoder), so only this workbench loads those.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from interp.atomic import atomic_write

from .strict_json import write_json

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
FEATURE_STATS_FILENAME = "feature_stats.safetensors"  # ours: per-feature mean/std activation, optional
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class SAEFormatError(ValueError):
    """A directory that is not a loadable SAE, with the reason."""


# ----------------------------------------------------------------------------- architectures

@dataclass(frozen=True)
class Architecture:
    """How one inference architecture turns pre-activations into latents, and what it stores beyond the four
    shared tensors (W_enc, b_enc, W_dec, b_dec). ``from_sae_lens`` maps a sae-lens checkpoint of another
    architecture onto this one (BatchTopK runs as JumpReLU)."""

    name: str
    activate: Callable[["SAE", torch.Tensor], torch.Tensor]   # (sae, pre (..., d_sae)) -> latents
    extra_parameters: tuple[str, ...] = ()                     # (d_sae,) tensors, e.g. threshold
    needs_k: bool = False
    sae_lens_names: tuple[str, ...] = ()                      # sae-lens architectures loaded as this one
    convert: Callable[[dict, dict], dict] | None = None       # (raw cfg, weights) -> weights, for those
    lens_names: tuple[tuple[str, str], ...] = ()               # (our tensor name, sae-lens' name) where they differ


ARCHITECTURE_REGISTRY: dict[str, Architecture] = {}


def register_architecture(architecture: Architecture) -> Architecture:
    ARCHITECTURE_REGISTRY[architecture.name] = architecture
    return architecture


def _topk(sae: "SAE", pre: torch.Tensor) -> torch.Tensor:
    top = pre.topk(sae.cfg.k, dim=-1, sorted=False)
    return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())


def _batchtopk_threshold(raw_cfg: dict, weights: dict) -> dict:
    if "threshold" not in weights:
        if "topk_threshold" not in weights:
            raise SAEFormatError("batchtopk weights lack topk_threshold")
        weights["threshold"] = weights.pop("topk_threshold").expand(raw_cfg["d_sae"]).clone()
    return weights


register_architecture(Architecture("topk", _topk, needs_k=True))
register_architecture(Architecture("jumprelu", lambda sae, pre: pre.relu() * (pre > sae.threshold),
                                   extra_parameters=("threshold",), sae_lens_names=("batchtopk",),
                                   convert=_batchtopk_threshold))
register_architecture(Architecture("standard", lambda sae, pre: pre.relu()))


def _gated(sae: "SAE", pre: torch.Tensor) -> torch.Tensor:
    """sae-lens' GatedSAE.encode from the gate's pre-activation (x - b_dec) @ W_enc + b_gate (stored as b_enc):
    the gate is pre > 0; the magnitude path shares W_enc, its columns scaled by exp(r_mag), with its own bias b_mag,
    so its pre-activation is (pre - b_gate) * exp(r_mag) + b_mag."""
    magnitude = ((pre - sae.b_enc) * sae.r_mag.exp() + sae.b_mag).relu()
    return (pre > 0).to(pre.dtype) * magnitude


register_architecture(Architecture("gated", _gated, extra_parameters=("b_mag", "r_mag"),
                                   lens_names=(("b_enc", "b_gate"),)))
ARCHITECTURES = tuple(ARCHITECTURE_REGISTRY)  # as registered at import

# cfg.json architecture name of a transcoder -> (our activation architecture, skip path); sae-lens 6 knows the
# first four (sae_lens.saes.transcoder), the topk ones are ours.
TRANSCODER_NAMES: dict[str, tuple[str, bool]] = {
    "transcoder": ("standard", False), "skip_transcoder": ("standard", True),
    "jumprelu_transcoder": ("jumprelu", False), "jumprelu_skip_transcoder": ("jumprelu", True),
    "topk_transcoder": ("topk", False), "topk_skip_transcoder": ("topk", True),
}


def transcoder_name(architecture: str, skip: bool) -> str:
    for name, value in TRANSCODER_NAMES.items():
        if value == (architecture, skip):
            return name
    raise SAEFormatError(f"no transcoder format for a {architecture} activation")


def _architecture_of_sae_lens(name: str) -> Architecture:
    for architecture in ARCHITECTURE_REGISTRY.values():
        if name == architecture.name or name in architecture.sae_lens_names:
            return architecture
    known = [a.name for a in ARCHITECTURE_REGISTRY.values()] + [n for a in ARCHITECTURE_REGISTRY.values()
                                                                for n in a.sae_lens_names]
    raise SAEFormatError(f"sae-lens architecture {name!r} is not supported here; supported: {', '.join(known)}")


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors' own error type: a truncated or corrupt file
        raise SAEFormatError(f"{path} is not a readable safetensors file ({err}): it is truncated or corrupt; "
                             "copy it again, or save the SAE again") from None


def check_finite(weights: dict[str, torch.Tensor], source: str) -> None:
    """Refuse weights holding NaN or infinities (a diverged or damaged SAE): every latent they touch
    would be NaN, and so would every image edited with them."""
    bad = [f"{name} ({int((~torch.isfinite(t)).sum())} values)" for name, t in weights.items()
           if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise SAEFormatError(f"{source}: NaN or Inf in {', '.join(bad)}; the SAE is diverged or damaged")


@dataclass
class SAEConfig:
    architecture: str
    d_in: int
    d_sae: int
    k: int | None = None  # topk only
    apply_b_dec_to_input: bool = True
    dtype: str = "float32"
    metadata: dict = field(default_factory=dict)  # hook_name (block), model_name, training figures
    transcoder: bool = False  # reads hook_name, writes metadata hook_name_out (see the module's docstring)
    d_out: int | None = None  # a transcoder's output width (None: d_in)
    skip: bool = False  # a transcoder's linear skip path W_skip

    def __post_init__(self):
        if self.transcoder:
            self.d_out = self.d_out or self.d_in
            self.apply_b_dec_to_input = False  # b_dec lives in the output space
        elif self.skip or (self.d_out is not None and self.d_out != self.d_in):
            raise SAEFormatError("d_out and skip are transcoder settings; an SAE reconstructs its input")
        if self.architecture not in ARCHITECTURE_REGISTRY:
            raise SAEFormatError(f"unknown SAE architecture {self.architecture!r}; known: "
                                 f"{', '.join(ARCHITECTURE_REGISTRY)}")
        if ARCHITECTURE_REGISTRY[self.architecture].needs_k and not (self.k and 0 < self.k <= self.d_sae):
            raise SAEFormatError(f"a {self.architecture} SAE needs 0 < k <= d_sae, got k={self.k}, d_sae={self.d_sae}")

    def to_sae_lens_dict(self) -> dict:
        """cfg.json as sae-lens writes it for this architecture (unknown keys are ignored there)."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            lens_version = version("sae-lens")
        except PackageNotFoundError:
            lens_version = "6.0.0"
        architecture = transcoder_name(self.architecture, self.skip) if self.transcoder else self.architecture
        cfg = {"architecture": architecture, "d_in": self.d_in, "d_sae": self.d_sae, "dtype": self.dtype,
               "device": "cpu", "apply_b_dec_to_input": self.apply_b_dec_to_input, "normalize_activations": "none",
               "reshape_activations": "none",
               "metadata": {"sae_lens_version": lens_version, "sae_lens_training_version": lens_version,
                            **self.metadata}}
        if ARCHITECTURE_REGISTRY[self.architecture].needs_k:
            cfg.update(k=self.k, rescale_acts_by_decoder_norm=False)
        if self.transcoder:
            cfg["d_out"] = self.d_out
        return cfg


class SAE(nn.Module):
    """Inference SAE. Accepts any leading shape: x (..., d_in) -> latents (..., d_sae)."""

    def __init__(self, cfg: SAEConfig):
        super().__init__()
        self.cfg = cfg
        dtype = _DTYPES[cfg.dtype]
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, dtype=dtype), requires_grad=False)
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype), requires_grad=False)
        d_out = cfg.d_out if cfg.transcoder else cfg.d_in
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, d_out, dtype=dtype), requires_grad=False)
        self.b_dec = nn.Parameter(torch.zeros(d_out, dtype=dtype), requires_grad=False)
        if cfg.skip:
            self.W_skip = nn.Parameter(torch.zeros(d_out, cfg.d_in, dtype=dtype), requires_grad=False)
        self.architecture = ARCHITECTURE_REGISTRY[cfg.architecture]
        for name in self.architecture.extra_parameters:
            setattr(self, name, nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype), requires_grad=False))
        # Per-feature mean / std activation when firing (the natural edit strength); optional.
        self.feature_mean: torch.Tensor | None = None
        self.feature_std: torch.Tensor | None = None

    # ----- the math -----------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.cfg.d_in:
            raise ValueError(f"SAE expects {self.cfg.d_in} channels in the last dimension, got shape {tuple(x.shape)}")

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> (..., d_sae)."""
        self._check_input(x)
        x = x.to(self.W_enc.dtype)
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode_sparse(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """TopK only: x (..., d_in) -> (values, indices), each (..., k); no dense latents built."""
        if self.cfg.architecture != "topk":
            raise ValueError(f"encode_sparse needs a topk SAE, this one is {self.cfg.architecture}")
        top = self.pre_activations(x).topk(self.cfg.k, dim=-1, sorted=False)
        return top.values.relu(), top.indices

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> latents (..., d_sae), non-negative and sparse."""
        return self.architecture.activate(self, self.pre_activations(x))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents: (..., d_sae) -> reconstruction (..., d_in)."""
        if latents.shape[-1] != self.cfg.d_sae:
            raise ValueError(f"SAE has {self.cfg.d_sae} latents, got shape {tuple(latents.shape)}")
        return latents.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def skip_output(self, x: torch.Tensor) -> torch.Tensor | None:
        """A skip transcoder's linear path x @ W_skip.T (..., d_out); None without one."""
        return x.to(self.W_skip.dtype) @ self.W_skip.T if self.cfg.skip else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in) -> reconstruction (..., d_in) (a transcoder's output (..., d_out), skip path included)."""
        out = self.decode(self.encode(x))
        skip = self.skip_output(x)
        return out if skip is None else out + skip

    def decoder_directions(self) -> torch.Tensor:
        """(d_sae, d_in): row f is what adding one unit of feature f writes into the block's output."""
        return self.W_dec

    # ----- files ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write cfg.json + sae_weights.safetensors (sae-lens format) into directory `path`.
        Each file is written to a temporary name and renamed, so a crash leaves the old file."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        to_lens = dict(self.architecture.lens_names)
        tensors = {to_lens.get(name, name): p.detach().contiguous() for name, p in self.named_parameters()}
        atomic_write(path / WEIGHTS_FILENAME, lambda tmp: save_file(tensors, tmp))
        if self.feature_mean is not None:
            stats = {"mean": self.feature_mean.contiguous()}
            if self.feature_std is not None:
                stats["std"] = self.feature_std.contiguous()
            atomic_write(path / FEATURE_STATS_FILENAME, lambda tmp: save_file(stats, tmp))
        write_json(path / CFG_FILENAME, self.cfg.to_sae_lens_dict(), indent=2)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, dtype: str | None = None) -> "SAE":
        """Load a sae-lens format directory (ours, or one written by sae-lens' save methods).

        dtype: the dtype to compute in; float32 unless asked, whatever the file stores
        (fp16 files are for shipping; CPU hooks run best in float32)."""
        path = Path(path)
        cfg_path, weights_path = path / CFG_FILENAME, path / WEIGHTS_FILENAME
        if not cfg_path.is_file() or not weights_path.is_file():
            raise SAEFormatError(f"{path} is not an SAE directory: it needs {CFG_FILENAME} and {WEIGHTS_FILENAME}")
        try:
            raw = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as err:
            raise SAEFormatError(f"{cfg_path} is not valid JSON: {err}") from err
        weights = _load_safetensors(weights_path)
        check_finite(weights, str(weights_path))
        sae = cls.from_sae_lens(raw, weights, dtype=dtype)
        stats_path = path / FEATURE_STATS_FILENAME
        if stats_path.is_file():
            stats = _load_safetensors(stats_path)
            sae.feature_mean, sae.feature_std = stats.get("mean"), stats.get("std")
        return sae

    @classmethod
    def from_sae_lens(cls, raw_cfg: dict, weights: dict[str, torch.Tensor], dtype: str | None = None) -> "SAE":
        """Build from a sae-lens cfg dict and state dict, folding what sae-lens leaves unfolded
        (decoder-norm rescaling of TopK / BatchTopK training checkpoints)."""
        architecture = raw_cfg.get("architecture", "standard")
        transcoder, skip = architecture in TRANSCODER_NAMES, False
        if transcoder:
            architecture, skip = TRANSCODER_NAMES[architecture]
        for key in ("d_in", "d_sae"):
            if key not in raw_cfg:
                raise SAEFormatError(f"cfg.json lacks {key!r}")
        if raw_cfg.get("normalize_activations", "none") not in ("none", None):
            raise SAEFormatError(f"activation normalisation {raw_cfg['normalize_activations']!r} is not folded into "
                                 "the weights; fold it in sae-lens before saving")
        if raw_cfg.get("reshape_activations", "none") not in ("none", None):
            raise SAEFormatError(f"reshape_activations={raw_cfg['reshape_activations']!r} is not supported")
        weights = {name: t.float() for name, t in weights.items()}
        kind = _architecture_of_sae_lens(architecture)
        for ours, lens in kind.lens_names:  # e.g. a gated SAE's b_gate is the b_enc of its gate path
            if lens in weights and ours not in weights:
                weights[ours] = weights.pop(lens)
        missing = {"W_enc", "b_enc", "W_dec", "b_dec"} - set(weights)
        if missing:
            raise SAEFormatError(f"weights lack {sorted(missing)}")
        if raw_cfg.get("rescale_acts_by_decoder_norm", False):
            norms = weights["W_dec"].norm(dim=1).clamp_min(1e-8)
            weights["W_enc"] = weights["W_enc"] * norms
            weights["b_enc"] = weights["b_enc"] * norms
            weights["W_dec"] = weights["W_dec"] / norms[:, None]
            # A BatchTopK threshold already applies to the rescaled pre-activations: unchanged.
        if architecture != kind.name and kind.convert is not None:  # e.g. BatchTopK runs as JumpReLU
            weights = kind.convert(raw_cfg, weights)
        architecture = kind.name
        if kind.needs_k and "k" not in raw_cfg:
            raise SAEFormatError(f"a {architecture} cfg.json needs 'k'")
        k = int(raw_cfg["k"]) if kind.needs_k else None
        metadata = dict(raw_cfg.get("metadata") or {})
        if "hook_name" in raw_cfg and "hook_name" not in metadata:
            metadata["hook_name"] = raw_cfg["hook_name"]
        cfg = SAEConfig(architecture=architecture, d_in=int(raw_cfg["d_in"]), d_sae=int(raw_cfg["d_sae"]), k=k,
                        apply_b_dec_to_input=bool(raw_cfg.get("apply_b_dec_to_input", True)),
                        dtype=dtype or "float32", metadata=metadata, transcoder=transcoder,
                        d_out=int(raw_cfg.get("d_out") or raw_cfg["d_in"]) if transcoder else None, skip=skip)
        sae = cls(cfg)
        expected = dict(sae.named_parameters())
        for name, param in expected.items():
            if name not in weights:
                raise SAEFormatError(f"weights lack {name!r}, which a {architecture} SAE needs")
            if weights[name].shape != param.shape:
                raise SAEFormatError(f"weight {name} has shape {tuple(weights[name].shape)}, "
                                     f"cfg.json implies {tuple(param.shape)}")
            param.data.copy_(weights[name])
        return sae

    def astype(self, dtype: str) -> "SAE":
        """A copy stored in `dtype` ("float16" to ship small files); the cfg says so too."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        copy = SAE(SAEConfig(**{**asdict(self.cfg), "dtype": dtype}))
        for name, param in self.named_parameters():
            getattr(copy, name).data.copy_(param.data)
        copy.feature_mean, copy.feature_std = self.feature_mean, self.feature_std
        return copy

    def config_dict(self) -> dict:
        return asdict(self.cfg)



def load_sae_set(root: str | os.PathLike, blocks=None, dtype: str | None = None) -> dict[str, SAE]:
    """The SAEs of one model: ``root/<block>/`` (cfg.json + weights) each, block name -> SAE (in eval mode).

    ``blocks`` None: every SAE directory under ``root``; otherwise those blocks (a ``unet.`` prefix on the
    directory or the name is allowed), skipping blocks without an SAE. An error when none is found."""
    from interp.names import block_name

    root = Path(root)
    if not root.is_dir():
        raise SAEFormatError(f"no SAE directory at {root}")
    found: dict[str, SAE] = {}
    if blocks is None:
        for cfg in sorted(root.glob(f"*/{CFG_FILENAME}")):
            found[block_name(cfg.parent.name)] = SAE.load(cfg.parent, dtype=dtype).eval()
    else:
        for block in blocks:
            key = block_name(block)
            for candidate in (root / key, root / f"unet.{key}"):
                if (candidate / CFG_FILENAME).is_file():
                    found[block] = SAE.load(candidate, dtype=dtype).eval()
                    break
    if not found:
        wanted = f" for {', '.join(blocks)}" if blocks is not None else ""
        raise SAEFormatError(f"{root} holds no SAE{wanted} (one directory per block, each with {CFG_FILENAME}; "
                             f"train some with `python -m saes train`)")
    return found


def _same_model(a: str, b: str) -> bool:
    """Whether two `--model` values name the same model: equal names, or names and directories that resolve to
    the same weights directory ("toy" and zoo/weights/t2i)."""
    if a == b:
        return True
    from interp.models.t2i import resolve

    try:
        sources = [resolve(name)[0] for name in (a, b)]
    except ValueError:  # not a text-to-image name: language models are compared by name
        return False
    return all(os.path.isdir(s) for s in sources) and Path(sources[0]).resolve() == Path(sources[1]).resolve()


def check_sae_model(saes: dict, model_name: str, where: str | os.PathLike) -> None:
    """A SAEFormatError if an SAE was trained on another model than `model_name` (its cfg.json's metadata
    model_name; an SAE that names none, like an imported one, is checked by its width only, where it is used)."""
    for block, sae in saes.items():
        trained_on = (sae.cfg.metadata or {}).get("model_name")
        if trained_on and not _same_model(str(trained_on), str(model_name)):
            raise SAEFormatError(f"the SAEs in {where} were trained on {trained_on} ({block}'s cfg.json: model_name), "
                                 f"not on {model_name}: use SAEs of {model_name} (python -m saes train on a store "
                                 f"collected from it), or --model {trained_on}")
