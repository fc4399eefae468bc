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


def _family_config(label: str, vocab_size: int):
    """The config of a tiny model of one of `interp.hooks.lm_sites.VERIFIED_ARCHITECTURES` (2 layers, d 32)."""
    import transformers as T

    ids = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
    llama_like = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **ids)
    builders = {
        "gpt2": lambda: T.GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids),
        "gpt_neox": lambda: T.GPTNeoXConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                                            num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                                            **ids),
        "gpt_neox-sequential": lambda: T.GPTNeoXConfig(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, use_parallel_residual=False, **ids),
        "llama": lambda: T.LlamaConfig(**llama_like),
        "llama-bias": lambda: T.LlamaConfig(**llama_like, attention_bias=True, mlp_bias=True),
        "llama-3.1-rope": lambda: T.LlamaConfig(**llama_like, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}),
        "mistral": lambda: T.MistralConfig(**llama_like),
        "qwen2": lambda: T.Qwen2Config(**llama_like),
        "qwen2-tied-sliding": lambda: T.Qwen2Config(**llama_like, tie_word_embeddings=True, use_sliding_window=True,
                                                    sliding_window=4, max_window_layers=1),
        "qwen3": lambda: T.Qwen3Config(**llama_like, head_dim=8),
        "gemma": lambda: T.GemmaConfig(**llama_like, head_dim=8),
        # final and attention soft-capping on, with a cap small enough to bend the tiny model's logits: logit
        # effects are linearised through the cap (interp.hooks.lm_steer.logit_effects)
        "gemma2": lambda: T.Gemma2Config(**llama_like, head_dim=8, final_logit_softcapping=0.5,
                                         attn_logit_softcapping=2.0),
        "gemma3": lambda: T.Gemma3TextConfig(**llama_like, head_dim=8, final_logit_softcapping=0.5,
                                             sliding_window=4),
        "phi3": lambda: T.Phi3Config(**llama_like),
        "olmo": lambda: T.OlmoConfig(**llama_like),
        "olmo2": lambda: T.Olmo2Config(**llama_like),
        "granite": lambda: T.GraniteConfig(**llama_like, residual_multiplier=0.3, embedding_multiplier=2.0,
                                           logits_scaling=4.0, attention_multiplier=0.5),
        "opt": lambda: T.OPTConfig(vocab_size=vocab_size, hidden_size=32, ffn_dim=48, num_hidden_layers=2,
                                   num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=32,
                                   dropout=0.0, **ids),
        "opt-350m": lambda: T.OPTConfig(vocab_size=vocab_size, hidden_size=32, ffn_dim=48, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=16,
                                        do_layer_norm_before=False, dropout=0.0, **ids),
        # mixture-of-experts llama-likes (experts routed per token after post_attention_layernorm)
        "mixtral": lambda: T.MixtralConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe": lambda: T.Qwen2MoeConfig(**llama_like, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=16, shared_expert_intermediate_size=24),
        "qwen3_moe": lambda: T.Qwen3MoeConfig(**llama_like, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=16),
        "olmoe": lambda: T.OlmoeConfig(**llama_like, num_experts=4, num_experts_per_tok=2),
        "granitemoe": lambda: T.GraniteMoeConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2,
                                                 residual_multiplier=0.3, embedding_multiplier=2.0,
                                                 logits_scaling=4.0, attention_multiplier=0.5),
        "smollm3": lambda: T.SmolLM3Config(**llama_like),
        "exaone": lambda: T.ExaoneConfig(**llama_like),
        "exaone4": lambda: T.Exaone4Config(**llama_like, head_dim=8, sliding_window=4),
        "glm": lambda: T.GlmConfig(**llama_like, head_dim=8),
        "glm4": lambda: T.Glm4Config(**llama_like, head_dim=8),
        "starcoder2": lambda: T.Starcoder2Config(**llama_like, residual_dropout=0.0, embedding_dropout=0.0),
        "stablelm": lambda: T.StableLmConfig(**llama_like),
        "stablelm-parallel": lambda: T.StableLmConfig(**llama_like, use_parallel_residual=True),
        "gpt_bigcode": lambda: T.GPTBigCodeConfig(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4,
                                                  n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                  **ids),
        "bloom": lambda: T.BloomConfig(vocab_size=vocab_size, hidden_size=32, n_layer=2, n_head=4,
                                       hidden_dropout=0.0, attention_dropout=0.0, **ids),
        "phi": lambda: T.PhiConfig(**{**llama_like, "num_key_value_heads": 4}, resid_pdrop=0.0, embd_pdrop=0.0),
        "gptj": lambda: T.GPTJConfig(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                     rotary_dim=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids),
        "falcon-7b": lambda: T.FalconConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, multi_query=True, parallel_attn=True,
                                            new_decoder_architecture=False, bias=False, **ids),
        "falcon-40b": lambda: T.FalconConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True,
                                             bias=False, **ids),
        "falcon-sequential": lambda: T.FalconConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, parallel_attn=False, alibi=True,
                                                    new_decoder_architecture=False, bias=True, **ids),
        "gpt_oss": lambda: T.GptOssConfig(**llama_like, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                          sliding_window=4),
        "llama4_text": lambda: T.Llama4TextConfig(**llama_like, head_dim=8, num_local_experts=4,
                                                  num_experts_per_tok=1, intermediate_size_mlp=48,
                                                  interleave_moe_layer_step=1),
        # TransformerLens' bridges of these three compute other numbers than the models (the suite checks that
        # --backend transformer_lens refuses them); the site table has no family for them
        "cohere": lambda: T.CohereConfig(**llama_like),
        "cohere2": lambda: T.Cohere2Config(**llama_like, sliding_window=4),
        "deepseek_v3": lambda: T.DeepseekV3Config(**{**llama_like, "num_key_value_heads": 4}, q_lora_rank=16,
                                                  kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4,
                                                  v_head_dim=8, moe_intermediate_size=16, n_routed_experts=4,
                                                  num_experts_per_tok=2, n_group=1, topk_group=1,
                                                  first_k_dense_replace=1),
    }
    if label not in builders:
        raise ValueError(f"no tiny config for {label!r}; known: {', '.join(builders)}")
    return builders[label]()


def tiny_family_lm(label: str, vocab_size: int, seed: int = 0, noise: float = 0.5):
    """A randomly initialised causal LM of one verified architecture (``interp.hooks.lm_sites.
    VERIFIED_ARCHITECTURES``' labels), float32, CPU, eval mode, eager attention. Every norm gain and every
    bias gets Gaussian noise of size ``noise`` (norm gains start at 1 or 0, biases at 0: an ignored gain or
    bias would not show otherwise)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = _family_config(label, vocab_size)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            is_norm = any(k in name for k in ("norm", "ln_", "layer_norm", "layernorm"))
            if leaf == "bias" or (is_norm and leaf == "weight"):
                # a biased output head (Phi, GPT-J) gets a tenth: enough to show, not so much that it decides
                # every greedy token whatever the stream (then steering could not be seen to act)
                scale = noise / 10 if name.startswith("lm_head") else noise
                parameter.add_(scale * torch.randn_like(parameter))
    return model
