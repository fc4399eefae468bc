"""Tiny randomly initialised Hugging Face causal LMs and word-level tokenizers, built offline.

Used by the tests and the benchmarks so that model-facing code runs without any download; the
same code paths take any real Hugging Face model.
"""

from __future__ import annotations

import re
from typing import Iterable

SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")


def word_level_tokenizer(texts: Iterable[str], extra_words: Iterable[str] = ()):
    """A ``PreTrainedTokenizerFast`` whose vocabulary is the words and punctuation of ``texts``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for text in texts for w in re.findall(r"\w+|[^\w\s]", text)} | set(extra_words))
    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                        bos_token="<s>", eos_token="</s>")
    tokenizer.padding_side = "right"
    return tokenizer


def tiny_llama(vocab_size: int, hidden_size: int = 32, layers: int = 4, heads: int = 4, seed: int = 0,
               max_positions: int = 128, kv_heads: int | None = None, tie_word_embeddings: bool = False):
    """A randomly initialised ``LlamaForCausalLM`` (float32, CPU) of the given size; ``kv_heads`` below
    ``heads`` gives grouped-query attention (as SmolLM2's 9 heads over 3)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                         max_position_embeddings=max_positions, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                         tie_word_embeddings=tie_word_embeddings)
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(vocab_size: int, hidden_size: int = 32, layers: int = 4, heads: int = 4, seed: int = 0,
              max_positions: int = 128):
    """A randomly initialised ``GPT2LMHeadModel`` (float32, CPU), dropout off."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=layers, n_head=heads,
                        n_positions=max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return GPT2LMHeadModel(config).eval()
