"""TransformerLens' own weight conversions for the families that have one (GPT-2, plain llama): a
``HookedTransformer`` with exactly a Hugging Face model's weights, no weight processing (no LayerNorm folding,
no centring), from a ``HookedTransformerConfig`` read off the Hugging Face config. The site table
(`interp.hooks.lm_sites`: ``LMFamily.hooked_transformer`` / ``converts_exactly``) says which family uses
which; `interp.models.lm.load_lm` calls them and checks the result against the model it came from.
"""

from __future__ import annotations

# TransformerLens keeps an (n_ctx, n_ctx) causal mask in every attention layer: 8192 positions would
# cost 2 GB for SmolLM2's 30 layers. Longer prompts get a clear error instead.
TL_MAX_CTX = 2048


def gpt2_to_hooked_transformer(hf_model, tokenizer, device: str = "cpu"):
    """A TransformerLens ``HookedTransformer`` with exactly the weights of a Hugging Face ``GPT2LMHeadModel``.

    Built from a ``HookedTransformerConfig`` read off the HF config (any size), weights converted by
    ``transformer_lens.pretrained.weight_conversions.convert_gpt2_weights``, no weight processing.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    c = hf_model.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn=c.activation_function,
        eps=c.layer_norm_epsilon, normalization_type="LN", positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel", default_prepend_bos=False, dtype=hf_model.dtype, device=device,
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx)
    hooked = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = {k: v.detach().clone() for k, v in convert_gpt2_weights(hf_model, cfg).items()}
    hooked.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False, refactor_factored_attn_matrices=False)
    return hooked.to(device).eval()


def llama_to_hooked_transformer(hf_model, tokenizer, device: str = "cpu"):
    """A TransformerLens ``HookedTransformer`` with exactly the weights of a Hugging Face ``LlamaForCausalLM``.

    TransformerLens 3.9 lists llama models by hub name only, so the ``HookedTransformerConfig`` is read
    off the HF config the way TransformerLens reads a llama config (RMSNorm, rotary, gated SiLU MLP,
    grouped-query attention), and the weights go through its ``convert_llama_weights``, unprocessed.
    The context is capped at ``TL_MAX_CTX``.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    from ..models.language_model import context_length

    c = hf_model.config
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_kv = c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None
    cfg = HookedTransformerConfig(
        n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads, d_head=d_head,
        d_mlp=c.intermediate_size, d_vocab=c.vocab_size, n_ctx=min(context_length(c) or 2048, TL_MAX_CTX),
        act_fn=c.hidden_act,
        eps=c.rms_norm_eps, normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=d_head,
        rotary_base=theta, rotary_adjacent_pairs=False, final_rms=True, gated_mlp=True, n_key_value_heads=n_kv,
        original_architecture="LlamaForCausalLM", default_prepend_bos=False, dtype=hf_model.dtype, device=device)
    hooked = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = {k: v.detach().clone() for k, v in convert_llama_weights(hf_model, cfg).items()}
    hooked.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                       fold_value_biases=False, refactor_factored_attn_matrices=False)
    return hooked.to(device).eval()


def llama_converts_exactly(config) -> bool:
    """Whether `llama_to_hooked_transformer` reads every weight of this config: it knows no biases and no rope
    scaling (those models go through TransformerLens' TransformerBridge instead)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return (rope.get("rope_type", "default") == "default" and not getattr(config, "attention_bias", False)
            and not getattr(config, "mlp_bias", False))


__all__ = ["TL_MAX_CTX", "gpt2_to_hooked_transformer", "llama_converts_exactly", "llama_to_hooked_transformer"]
