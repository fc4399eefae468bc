"""Activation store: the format on disk (block updates or LM residuals as sharded fp16 safetensors with
checksums), its writer's steps and its reader. The collectors that fill a store are `interp.collect`.

Layout of a store directory:

    plan.json                      what is being collected (model, blocks, prompts, seeds, steps, ...)
    shards/shard-000000.safetensors  images [0, n) : {block: (n, steps, C, H, W) fp16, "image_index": (n,)}
                                   (a joint block's text stream `<block>:text`: (n, steps, C, tokens))
    shards/shard-000001.safetensors  images [n, 2n) ...
    manifest.json                  written last: the plan, shapes, dtype and the list of shards,
                                   each with the sha256 of every tensor in it

An LM store has the same files, its unit a token instead of an image (`LM_KIND`, below).

Every file is written to a temporary name and renamed into place (`os.replace`), readable by
others (0o644, as `interp.atomic` writes), so a shard either exists whole or not at all. An
interrupted collection resumes by skipping the shards that exist. Under `torchrun
--nproc-per-node N`, rank r writes shards r, r + N, r + 2N, ... and rank 0 writes the one
manifest once every shard exists.

Checksums: each shard's tensors are hashed in memory just before they are written (no second
pass over the file) and the digests go into the shard's own header, from which the manifest copies them.
A reader checks a tensor against the manifest's digest the first time it reads it, so a shard
damaged after collection (a flipped bit, a bad copy) is an error naming the shard, never
silently wrong data. Stores written before checksums were recorded (no "sha256" in the
manifest's shard entries) still read, unchecked.

Reader: `ActivationStore(path).batches(block, batch_size)` streams shuffled float32
(batch, channels) vectors (one per position per step per image) a window of shards at a
time; `.image(i, block)` gives one image's (steps, C, H, W).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from dataclasses import asdict
from pathlib import Path
from typing import ClassVar, Iterable, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .atomic import atomic_write, remove_temporaries
from .names import LM, kind_word

FORMAT = "interp-activation-store"
VERSION = 1
PLAN_FILE = "plan.json"
# The manifest says how steps were stored: scheduler steps, each the mean of the denoiser calls it made
# (`calls_per_step`: Heun, 4 steps: [2, 2, 2, 1]; Euler: [1, 1, 1, 1]).
CALLS_PER_STEP = "calls_per_step"
STEP_REDUCTION = "step_reduction"
MANIFEST_FILE = "manifest.json"
SHARD_DIR = "shards"
STORE_DTYPE = torch.float16
CHECKSUM = "sha256"  # the key of the digests, in a shard's header metadata and its manifest entry
FILE_MODE = 0o644

# An LM store has the same files: plan.json, shards/shard-NNNNNN.safetensors and manifest.json (with
# every tensor's sha256), but its unit is a token, not an image. Shard k holds the residuals of tokens
# [k * tokens_per_shard, (k + 1) * tokens_per_shard) of the corpus in reading order:
#     {hook: (n, d_model) fp16, "token_index": (n,), "sequence": (n,), "position": (n,), "token_id": (n,)}
# The corpus is cut into sequences of at most `context` tokens, each led by one start token
# (interp.lm_text); the start token's own position is never stored, nor is padding.
LM_KIND = LM  # `interp.names`: a store says its kind in the one vocabulary (absent: "t2i")
LM_INDEX = "token_index"


class StoreError(ValueError):
    """A store that cannot be written or read, what state it is in and what to do."""


class StorePlan:
    """What the store's writer reads of a plan: the base of `interp.collect`'s CollectionPlan (images) and
    LMCollectionPlan (tokens), dataclasses whose fields are plan.json (and, with what the collection adds,
    manifest.json). Each has `blocks` (the hooked blocks or hook names), says how many units it collects
    (`n_units`) and puts in a shard (`units_per_shard`), the key of a shard's unit index (`INDEX_KEY`) and
    which fields a resumed run may change (`RESUME_IGNORES`)."""

    INDEX_KEY: ClassVar[str] = "image_index"
    RESUME_IGNORES: ClassVar[tuple[str, ...]] = ("shapes",)

    @property
    def n_units(self) -> int:
        raise NotImplementedError

    @property
    def units_per_shard(self) -> int:
        raise NotImplementedError

    @property
    def n_shards(self) -> int:
        return -(-self.n_units // self.units_per_shard)

    def shard_range(self, shard: int) -> tuple[int, int]:
        start = shard * self.units_per_shard
        return start, min(start + self.units_per_shard, self.n_units)

    def to_dict(self) -> dict:
        return asdict(self)


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}.safetensors"


# ----------------------------------------------------------------------------- writing

def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes as safetensors stores them (C order), hashed where they lie in memory."""
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()


def write_shard(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> dict[str, str]:
    """A safetensors file written atomically, with each tensor's digest in its header; returns the digests."""
    digests = {name: tensor_digest(tensor) for name, tensor in tensors.items()}
    metadata = {**(metadata or {}), CHECKSUM: json.dumps(digests)}
    # safetensors, like mkstemp, would leave the file private (0o600): atomic_write makes it FILE_MODE
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), mode=FILE_MODE, durable=True)
    return digests


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2)), mode=FILE_MODE, durable=True)


def _clean_temporaries(out: Path) -> None:
    for directory in (out, out / SHARD_DIR):
        remove_temporaries(directory)
        if directory.is_dir():  # the names of the store's own writer before it used interp.atomic
            for tmp in directory.glob("*.tmp-*"):
                tmp.unlink(missing_ok=True)


def shard_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def _shard_digests(path: Path) -> dict[str, str] | None:
    """The digests in a shard's header (cheap: no tensor is read); None for a shard written without them."""
    with safe_open(str(path), framework="pt") as f:
        recorded = (f.metadata() or {}).get(CHECKSUM)
    return json.loads(recorded) if recorded else None


def shard_is_whole(path: Path, plan: StorePlan) -> bool:
    """The header of an existing shard lists every block of the plan (cheap: no tensor is read)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return set(plan.blocks) | {plan.INDEX_KEY} <= set(f.keys())
    except Exception:  # noqa: BLE001 - any unreadable file is treated as missing
        return False


def check_plan(out: Path, plan: StorePlan) -> None:
    """Refuse a plan.json in `out` that differs from this plan (but in the fields a resumed run may change)."""
    existing = json.loads((out / PLAN_FILE).read_text())
    mine = plan.to_dict()
    existing.setdefault("model_dtype", mine.get("model_dtype"))  # a plan written before the dtype was recorded
    differing = sorted(k for k in mine if k not in plan.RESUME_IGNORES and existing.get(k) != mine[k])
    if differing:
        raise StoreError(f"{out} holds a collection with other settings ({', '.join(differing)} differ); "
                         f"resume with the same arguments or choose another --out")


def prepare_directory(out: Path, plan: StorePlan) -> None:
    """`out` and its shard directory exist and are writable, without temporaries; plan.json is written, or
    checked against the plan when it exists (a resumed run)."""
    try:
        (out / SHARD_DIR).mkdir(parents=True, exist_ok=True)
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise StoreError(f"cannot write to {out}: {err.strerror or err}") from None
    _clean_temporaries(out)
    if (out / PLAN_FILE).exists():
        check_plan(out, plan)
    else:
        try:
            write_json(out / PLAN_FILE, plan.to_dict())
        except OSError as err:
            raise StoreError(f"cannot write {out / PLAN_FILE}: {err.strerror or err}") from None


def write_resumable_shard(plan: StorePlan, shard_dir: Path, shard: int, tensors: dict[str, torch.Tensor],
                          metadata: dict[str, str] | None = None) -> None:
    """Write one shard (its [start, stop) in the header); a failed write says how to resume."""
    start, stop = plan.shard_range(shard)
    try:
        write_shard(shard_dir / shard_name(shard), tensors,
                    metadata={**(metadata or {}), "start": str(start), "stop": str(stop)})
    except OSError as err:
        done = sum(shard_is_whole(shard_dir / shard_name(k), plan) for k in range(plan.n_shards))
        raise StoreError(f"cannot write shard {shard} to {shard_dir}: {err.strerror or err}; the store is "
                         f"consistent ({done} of {plan.n_shards} shards complete): fix the cause and run "
                         f"the same command again to resume") from None


def write_manifest(out: Path, plan: StorePlan, manifest: dict) -> None:
    """Check that every shard of the plan exists, then write `manifest` with the shard list and digests."""
    shard_dir = out / SHARD_DIR
    missing = [k for k in range(plan.n_shards) if not shard_is_whole(shard_dir / shard_name(k), plan)]
    if missing:
        raise StoreError(f"{len(missing)} shard(s) missing after collection (first: {missing[0]}); "
                         f"run the same command again to resume")
    manifest["shards"] = []
    for k in range(plan.n_shards):
        entry = {"file": f"{SHARD_DIR}/{shard_name(k)}", "start": plan.shard_range(k)[0],
                 "stop": plan.shard_range(k)[1]}
        digests = _shard_digests(shard_dir / shard_name(k))
        if digests is not None:  # a shard written before checksums were recorded has none
            entry[CHECKSUM] = digests
        manifest["shards"].append(entry)
    try:
        write_json(out / MANIFEST_FILE, manifest)
    except OSError as err:
        raise StoreError(f"every shard is written but the manifest is not: {err.strerror or err}; "
                         f"run the same command again to finish") from None


# ----------------------------------------------------------------------------- reading

def window_batches(chunks: Iterable[torch.Tensor], batch_size: int, *, buffer_vectors: int, shuffle: bool = True,
                   seed: int = 0, drop_last: bool = False) -> Iterator[torch.Tensor]:
    """(batch_size, channels) batches from a stream of (n, channels) chunks, shuffled by window: chunks are held
    until at least `buffer_vectors` vectors are, which are shuffled together (one generator, seeded `seed`) and
    cut into full batches; the rest carries into the next window. The last partial batch is yielded unless
    `drop_last`. Memory stays about one window. The store's reader and `collect.stream_vectors` both batch so."""
    generator = torch.Generator().manual_seed(seed)
    pending: list[torch.Tensor] = []
    held = 0
    carry = None

    def cut():
        nonlocal pending, held, carry
        window = torch.cat(([carry] if carry is not None else []) + pending)
        pending, held = [], 0
        if shuffle:
            window = window[torch.randperm(len(window), generator=generator)]
        n_full = len(window) // batch_size * batch_size
        for i in range(0, n_full, batch_size):
            yield window[i:i + batch_size]
        carry = window[n_full:] if n_full < len(window) else None

    for chunk in chunks:
        pending.append(chunk)
        held += len(chunk)
        if held >= buffer_vectors:
            yield from cut()
    if pending:
        yield from cut()
    if carry is not None and not drop_last:
        yield carry


class ActivationStore:
    """A finished store: per-image access and shuffled streams of (batch, channels) vectors.

    Each tensor read is checked against its sha256 in the manifest the first time this object reads
    it (a `StoreError` names a damaged shard); a store written before checksums reads unchecked."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        manifest_file = self.path / MANIFEST_FILE
        if not manifest_file.exists():
            if (self.path / PLAN_FILE).exists():
                raise StoreError(f"{self.path} is an unfinished collection: run the same collect command again "
                                 f"to resume and finish it")
            raise StoreError(f"{self.path} is not an activation store (no {MANIFEST_FILE})")
        try:
            self.manifest: dict = json.loads(manifest_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise StoreError(f"{manifest_file} is damaged ({err}); run the collect command that made the store "
                             f"again to rewrite it") from None
        if self.manifest.get("format") != FORMAT:
            raise StoreError(f"{manifest_file} is not an {FORMAT} manifest")
        self.blocks: list[str] = list(self.manifest["blocks"])
        self.shards: list[dict] = self.manifest["shards"]
        self.kind: str = kind_word(self.manifest.get("kind"))  # LM_KIND ("lm"): tokens, else "t2i": images
        self._checked: set[tuple[str, str]] = set()  # (shard file, block) read and found intact

    def __len__(self) -> int:
        """Images (a diffusion store) or tokens (an LM store)."""
        return int(self.manifest["n_tokens" if self.kind == LM_KIND else "n_images"])

    @property
    def n_tokens(self) -> int:
        """Tokens of an LM store (each one vector per hook)."""
        self._require_lm("n_tokens")
        return int(self.manifest["n_tokens"])

    def _require_lm(self, what: str) -> None:
        if self.kind != LM_KIND:
            raise StoreError(f"{what}: the store at {self.path} holds images, not language-model tokens")

    @property
    def prompts(self) -> list[str]:
        if self.kind == LM_KIND:
            raise StoreError(f"the store at {self.path} holds language-model tokens of {self.manifest['text']}, "
                             f"not prompts of images")
        return list(self.manifest["prompts"])

    def prompt(self, index: int) -> str:
        return self.manifest["prompts"][index]

    def channels(self, block: str) -> int:
        if self.kind == LM_KIND:
            return int(self._shape(block)[-1])
        return int(self._shape(block)[1])

    def n_vectors(self, block: str) -> int:
        if self.kind == LM_KIND:
            self._shape(block)
            return self.n_tokens
        steps, _, *positions = self._shape(block)  # (H, W) of a grid, (tokens,) of a text stream
        return len(self) * steps * math.prod(positions)

    def _shape(self, block: str) -> list[int]:
        if block not in self.blocks:
            raise StoreError(f"block {block!r} is not in the store; it holds: {', '.join(self.blocks)}")
        return self.manifest["shapes"][block]

    def _damaged(self, shard: dict, problem: str) -> StoreError:
        """The error for a shard that is missing or damaged, saying how to rewrite it."""
        name = f"shard {shard['file']} of the store at {self.path}"
        again = "run the collect command that made the store again to rewrite it"
        if not (self.path / shard["file"]).is_file():
            return StoreError(f"{name} is missing: {again}")
        return StoreError(f"{name} {problem}: the file is damaged (a disk or copy error); delete it and {again}")

    def _unchecked(self, shard: dict, block: str) -> bool:
        return CHECKSUM in shard and (shard["file"], block) not in self._checked

    def _read(self, shard: dict, block: str) -> torch.Tensor:
        """(n, steps, C, H, W) of one shard, as stored (fp16), checked against the manifest's digest."""
        try:
            with safe_open(str(self.path / shard["file"]), framework="pt") as f:
                tensor = f.get_tensor(block)
        except Exception as err:  # safetensors' own error type: a truncated file, a broken header
            raise self._damaged(shard, f"cannot be read ({err})") from None
        if self._unchecked(shard, block):
            if tensor_digest(tensor) != shard[CHECKSUM].get(block):
                raise self._damaged(shard, f"does not match its {CHECKSUM} in the manifest ({block!r})")
            self._checked.add((shard["file"], block))
        return tensor

    def image(self, index: int, block: str) -> torch.Tensor:
        """(steps, channels, height, width) float32: the block's update at each step of image `index`
        ((steps, channels, tokens) for a text stream `<block>:text`).
        The first image of a shard reads (and checks) the block's whole tensor of that shard."""
        self._shape(block)
        if self.kind == LM_KIND:
            raise StoreError(f"the store at {self.path} holds language-model tokens, not images: read it with "
                             f".batches(block, batch_size) or .token_table()")
        if not 0 <= index < len(self):
            raise IndexError(f"image {index} out of range: the store has {len(self)} images")
        shard = self.shards[index // self.manifest["images_per_shard"]]
        if self._unchecked(shard, block):
            return self._read(shard, block)[index - shard["start"]].float()
        try:
            with safe_open(str(self.path / shard["file"]), framework="pt") as f:
                return f.get_slice(block)[index - shard["start"]].float()
        except Exception as err:  # safetensors' own error type: a truncated file, a broken header
            raise self._damaged(shard, f"cannot be read ({err})") from None

    def _shard_vectors(self, shard: dict, block: str) -> torch.Tensor:
        """(n * steps * H * W, C) float32: every position of every step of the shard's images (a text stream's
        (n, steps, C, tokens): every token)."""
        x = self._read(shard, block)
        if self.kind == LM_KIND:  # (tokens, d_model)
            return x.float()
        return x.movedim(2, -1).reshape(-1, x.shape[2]).float()

    def token_table(self) -> dict[str, torch.Tensor]:
        """An LM store's token bookkeeping in store order: {"token_index", "sequence", "position", "token_id"},
        each (n_tokens,) int64 (sequence: index into the corpus' cut sequences; position: within it)."""
        self._require_lm("token_table")
        keys = (LM_INDEX, "sequence", "position", "token_id")
        parts = {key: [] for key in keys}
        for shard in self.shards:
            for key in keys:
                parts[key].append(self._read(shard, key))
        return {key: torch.cat(values) for key, values in parts.items()}

    def batches(self, block: str, batch_size: int, shuffle: bool = True, seed: int = 0,
                buffer_vectors: int = 1 << 18, drop_last: bool = False,
                paired: str | None = None) -> Iterator[torch.Tensor]:
        """One pass over every vector of the block, as float32 (batch, channels) tensors.

        ``paired``: a second block of the same store; each row is then the block's vector and the paired
        block's vector of the same token side by side, (batch, channels + paired channels), shuffled together
        (a transcoder's (input, target) pairs).

        Shuffling is by window: shards are visited in a random order and read until at
        least `buffer_vectors` vectors are in memory, which are shuffled together and
        yielded; memory stays about `buffer_vectors * channels * 4` bytes, not the store.
        """
        self._shape(block)
        if paired is not None:
            self._shape(paired)
            if self.kind != LM_KIND:
                raise StoreError("paired blocks are read from language-model stores only (one vector per token)")
        if batch_size < 1:
            raise StoreError(f"batch_size must be positive, not {batch_size}")
        order = list(range(len(self.shards)))
        if shuffle:
            random.Random(seed).shuffle(order)
        if paired is None:
            chunks = (self._shard_vectors(self.shards[i], block) for i in order)
        else:
            chunks = (torch.cat([self._shard_vectors(self.shards[i], block),
                                 self._shard_vectors(self.shards[i], paired)], dim=1) for i in order)
        yield from window_batches(chunks, batch_size, buffer_vectors=buffer_vectors, shuffle=shuffle, seed=seed,
                                  drop_last=drop_last)
