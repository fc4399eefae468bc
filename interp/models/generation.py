"""Fast greedy batched generation for any Hugging Face causal LM with a KV cache.

    from interp.models.generation import Cancelled, greedy_generate
    completions = greedy_generate(model, tokenizer, texts, max_new_tokens=64)

Compared with batched ``model.generate`` (every row of a batch runs until its last row stops, the
cache grows by concatenation, batches come in the caller's order):

- prompts are sorted by token length, longest first (so the memory peak comes first), before
  batching, so a batch holds little padding; batches are capped both in rows (``batch_size``) and
  in cache positions (``max_batch_tokens``: rows x (longest prompt + ``max_new_tokens``)), so that
  a batch of long prompts stays small and the cache's memory is bounded;
- each batch is left-padded, with ``position_ids`` from the attention mask's cumsum (what
  ``generate`` does), so every row's first new token follows its own last prompt token;
- one prefill computes the logits of the last position only, then one token a step through a
  ``transformers.DynamicCache`` whose full-attention layers write into buffers allocated once for
  the batch's whole length (``DynamicLayer`` concatenates, copying the whole cache at every step;
  SmolLM2-135M at batch 128: 191 ms a step against ``generate``'s 218 ms);
- a row stops at any EOS id (the tokenizer's and the generation config's) or after
  ``max_new_tokens``, and is then removed from the running batch: the cache
  (``Cache.batch_select_indices``), the mask and the positions are sliced along the batch
  dimension, so a step costs what the rows still running cost.

The choice at each step is a plain argmax of the logits: the same tokens as
``model.generate(do_sample=False)`` of each prompt alone, up to float round-off near ties (batched
and padded matrix products round differently). Logits processors that a generation config may
ask for (repetition penalty, banned words, minimum length, ...) are not applied.

Batch size is what matters most on a CPU: a decoding step reads all the weights whatever the
batch, so tokens per second grow with the rows until the products are compute-bound (a step takes
69 ms at 16 rows and about 200 ms at 128). Hence ``DEFAULT_BATCH_SIZE``: all of XSTest (450
prompts, 64 new tokens) with SmolLM2-135M on the 2-core machine, 2 threads, takes 77 s at 64 rows,
64-66 s at 128, 68 s at 225 and 89 s at 450 (``benchmarks/lm_generate.py --full`` times it).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .language_model import context_length  # noqa: F401 - defined with the loaded LM's type, also named here

DEFAULT_BATCH_SIZE = 128
DEFAULT_MAX_BATCH_TOKENS = 16384


class Cancelled(Exception):
    """Generation stopped because the caller's ``cancel`` flag was raised."""


def eos_ids(model, tokenizer) -> set[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's EOS ids."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos is not None:
        ids.update(int(i) for i in config_eos)
    return ids


def _cancel_check(cancel: Callable[[], bool] | threading.Event | None) -> Callable[[], None]:
    if cancel is None:
        return lambda: None
    is_set = cancel.is_set if isinstance(cancel, threading.Event) else cancel

    def check() -> None:
        if is_set():
            raise Cancelled("generation cancelled")

    return check


class _PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers of ``capacity`` positions, so
    that a step writes its new position instead of concatenating a copy of the whole cache."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[3]))
        self.value_buffer = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[3]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.key_buffer[:, :, self.length:end] = key_states
        self.value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
            self._views()

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, :self.length]
        self.values = self.value_buffer[:, :, :self.length]


def _cache(model, capacity: int) -> DynamicCache:
    """The model's ``DynamicCache`` with its plain full-attention layers preallocated (sliding-window
    and other special layers are kept as they are)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [_PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _batches(lengths: Sequence[int], order: Sequence[int], batch_size: int, max_batch_tokens: int,
             max_new_tokens: int) -> Iterator[list[int]]:
    """Consecutive runs of ``order`` (longest prompt first) of at most ``batch_size`` rows and
    ``max_batch_tokens`` cache positions (always at least one row)."""
    batch: list[int] = []
    for index in order:
        longest = lengths[batch[0]] if batch else lengths[index]
        if batch and (len(batch) == batch_size or (len(batch) + 1) * (longest + max_new_tokens) > max_batch_tokens):
            yield batch
            batch = []
        batch.append(index)
    if batch:
        yield batch


def _generate_batch(model, prompts: Sequence[list[int]], max_new_tokens: int, stop_ids: set[int], pad_id: int,
                    check_cancel: Callable[[], None], record: list | None = None
                    ) -> Iterator[list[tuple[int, list[int]]]]:
    """The (row, new tokens) of the rows of one batch that finish at a step, for each step where some do.
    ``record``: a list that receives each step's logits (rows still running, vocab)."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = _cache(model, width + max_new_tokens)
    check_cancel()
    from ..hooks.lm_nnsight import call_model  # the model itself, or through nnsight's trace (--backend nnsight)

    logits = call_model(model, input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                        use_cache=True, logits_to_keep=1).logits[:, -1]
    positions = positions[:, -1:] + 1
    running = list(range(len(prompts)))  # batch row of each row still decoding
    new_tokens: list[list[int]] = [[] for _ in prompts]
    for step in range(max_new_tokens):
        if record is not None:
            record.append(logits.float().cpu().clone())
        tokens = logits.argmax(-1)
        keep, finished = [], []
        for slot, (row, token) in enumerate(zip(running, tokens.tolist())):
            new_tokens[row].append(token)
            if token in stop_ids or step == max_new_tokens - 1:
                finished.append((row, new_tokens[row]))
            else:
                keep.append(slot)
        if finished:
            yield finished
        if not keep:
            return
        if len(keep) < len(running):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, positions, tokens = mask[index], positions[index], tokens[index]
            running = [running[slot] for slot in keep]
        mask = torch.cat([mask, mask.new_ones((len(running), 1))], dim=-1)
        check_cancel()
        logits = call_model(model, input_ids=tokens[:, None], attention_mask=mask, position_ids=positions,
                            cache=cache, use_cache=True).logits[:, -1]
        positions = positions + 1


# The largest difference cached decoding may show against the model's full forward pass, as a fraction of the
# largest logit (float32 sums in another order: ~1e-6 of it; a model that ignores the cache: of order 1).
CACHE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4}


@torch.inference_mode()
def check_cached_decoding(model, prompts: Sequence[list[int]], stop_ids: set[int], pad_id: int,
                          steps: int = 4) -> None:
    """Refuse in one ValueError line a model whose KV-cache decoding (`_generate_batch`: left padding, a
    ``DynamicCache``) computes other logits than its own full forward pass over the same tokens: a model outside
    the site table (`interp.hooks.lm_sites`), whose cache and padding the suite has not checked (a Mamba keeps a
    state of its own and ignores the cache it is given). Up to two prompts of different lengths are decoded for
    ``steps`` tokens, then each prompt plus its tokens goes through the model alone, without a cache."""
    rows = [list(prompts[0])] + ([list(prompts[0][:-2])] if len(prompts[0]) > 2 else [])
    record: list[torch.Tensor] = []
    name = type(model).__name__
    try:
        finished = {}
        for done in _generate_batch(model, rows, steps, set(), pad_id, lambda: None, record=record):
            finished.update(done)
        worst = 0.0
        for row, prompt in enumerate(rows):
            tokens = finished[row]
            ids = torch.tensor([prompt + tokens[:-1]], device=next(model.parameters()).device)
            full = model(input_ids=ids).logits[0, len(prompt) - 1:].float().cpu()
            cached = torch.stack([step[row] for step in record])
            worst = max(worst, ((cached - full).abs().max() / full.abs().max().clamp_min(1e-12)).item())
    except Exception as error:  # noqa: BLE001 - a model that cannot take the cache's arguments: refused alike
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise ValueError(f"greedy decoding cannot run {name} (model_type {getattr(model.config, 'model_type', '?')!r}) "
                         f"with a KV cache: {first}; refused") from error
    tolerance = CACHE_TOLERANCE.get(next(model.parameters()).dtype, 3e-2)
    if not worst <= tolerance:
        raise ValueError(f"greedy decoding with a KV cache computes other logits than {name} (model_type "
                         f"{getattr(model.config, 'model_type', '?')!r}) itself: off by {worst:.2g} of the largest "
                         f"logit (tolerance {tolerance:g}); refused (the model is outside the site table, "
                         f"interp/hooks/lm_sites.py). --backend transformer_lens decodes with full forward passes, "
                         f"no cache, where TransformerLens runs the model")


def _check_outside_the_table(model, prompts, pad_id: int) -> None:
    """`check_cached_decoding`, once per model object, for a model the site table has no family for."""
    from ..hooks.lm_sites import find_family, hf_base_model

    base = hf_base_model(model)
    if base.__dict__.get("_interp_cached_decoding") or find_family(base.config, type(base).__name__) is not None:
        return
    check_cached_decoding(base, prompts, set(), pad_id)
    base.__dict__["_interp_cached_decoding"] = True


def greedy_generate_tokens(model, tokenizer, texts: Sequence[str], max_new_tokens: int = 64,
                           batch_size: int = DEFAULT_BATCH_SIZE, add_special_tokens: bool = False,
                           progress: bool = False, cancel: Callable[[], bool] | threading.Event | None = None,
                           on_progress: Callable[[int, int], None] | None = None,
                           max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> list[list[int]]:
    """The new token ids of each text, in the order of ``texts``, up to and including the first EOS
    id; see ``greedy_generate`` for the arguments."""
    from tqdm.auto import tqdm

    if not texts:
        raise ValueError("no texts to generate from")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
    prompts = tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
    limit = context_length(model.config)
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"text {index} has no tokens: there is nothing to continue")
        if limit is not None and len(prompt) + max_new_tokens > limit:
            raise ValueError(f"text {index} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} it "
                             f"exceeds the model's context of {limit} tokens")
    stop_ids = eos_ids(model, tokenizer)
    pad_id = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)
    lengths = [len(p) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
    check_cancel = _cancel_check(cancel)
    completions: list[list[int]] = [[] for _ in prompts]
    done = 0
    was_training = model.training
    model.eval()
    try:
        _check_outside_the_table(model, [prompts[order[0]]], pad_id)
        with torch.inference_mode(), tqdm(total=len(prompts), desc="generating", disable=not progress) as bar:
            for batch in _batches(lengths, order, batch_size, max_batch_tokens, max_new_tokens):
                for finished in _generate_batch(model, [prompts[i] for i in batch], max_new_tokens, stop_ids,
                                                pad_id, check_cancel):
                    for row, tokens in finished:
                        completions[batch[row]] = tokens
                    done += len(finished)
                    bar.update(len(finished))
                    if on_progress is not None:
                        on_progress(done, len(prompts))
    finally:
        model.train(was_training)
    return completions


def greedy_generate(model, tokenizer, texts: Sequence[str], max_new_tokens: int = 64,
                    batch_size: int = DEFAULT_BATCH_SIZE, add_special_tokens: bool = False, progress: bool = False,
                    cancel: Callable[[], bool] | threading.Event | None = None,
                    on_progress: Callable[[int, int], None] | None = None,
                    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS) -> list[str]:
    """Greedy completions of ``texts``, in their order: the new tokens only, decoded with special
    tokens skipped and stripped.

    A completion ends at the first EOS id (kept in the tokens, so dropped by the decoding when it
    is a special token, as with ``generate``) or after ``max_new_tokens``. ``add_special_tokens``:
    let the tokenizer add its BOS etc. (False for texts already in a chat template, which holds its
    own). ``cancel`` (a callable that returns True, or a ``threading.Event`` that is set) is checked
    before every forward pass and raises ``Cancelled``. ``progress`` shows a tqdm bar over prompts;
    ``on_progress(done, total)`` is called whenever prompts finish. ``max_batch_tokens`` caps a
    batch's cache positions, rows x (longest prompt + ``max_new_tokens``); a single prompt over it
    still runs, alone.

    A model outside the site table (`interp.hooks.lm_sites`) is first checked once: its cached decoding must
    give its own full forward pass's logits (`check_cached_decoding`), or it is refused in one line.

    Errors (``ValueError``): no texts, ``max_new_tokens``/``batch_size``/``max_batch_tokens`` below
    1, a text with no tokens, a text whose tokens plus ``max_new_tokens`` exceed the model's context.
    The model is put in eval mode and its training flag restored afterwards; the tokenizer is not
    changed.
    """
    tokens = greedy_generate_tokens(model, tokenizer, texts, max_new_tokens, batch_size, add_special_tokens,
                                    progress, cancel, on_progress, max_batch_tokens)
    return [text.strip() for text in tokenizer.batch_decode(tokens, skip_special_tokens=True)]


__all__ = ["CACHE_TOLERANCE", "DEFAULT_BATCH_SIZE", "DEFAULT_MAX_BATCH_TOKENS", "Cancelled", "check_cached_decoding",
           "context_length", "eos_ids",
           "greedy_generate", "greedy_generate_tokens"]
