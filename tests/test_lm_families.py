"""Every language-model architecture the workbench claims, checked against the model's own forward pass.

For each entry of `interp.hooks.lm_sites.VERIFIED_ARCHITECTURES` a tiny random-weight model is built
here (`flowlens.tiny.tiny_family_lm`: two layers, d 32, noise on every norm gain and bias so that an
ignored one shows), and:

- every residual site the workbench captures is the true stream: resid_pre / resid_post against the
  model's ``output_hidden_states``, resid_mid against the stream rebuilt from the *attention* side
  (block input + what that side writes, per family below), which the site table never reads;
- a write at resid_mid (SAE splice and steering) moves the true stream exactly: the logits equal those
  of an independent write on the attention side;
- greedy generation equals ``model.generate``;
- feature cards' logit effects equal the true linearised effect: the derivative of the model's whole
  forward pass (forward-mode autodiff) with the last layer's output set;
- the TransformerLens backend (TransformerBridge, or the local conversions) reads the same residuals
  as the Hugging Face backend, generates the same greedy completions and is steered the same at every
  site, or refuses in one line.
"""

from __future__ import annotations

import pytest
import torch

from flowlens.tiny import tiny_family_lm, word_level_tokenizer
from interp.hooks.lm import capture_residuals, model_sites, residual_hook_names
from interp.hooks.lm_sites import (PARALLEL_LABELS, TRANSFORMER_LENS_REFUSED, VERIFIED_ARCHITECTURES, LMHookError,
                                   family_of, lm_sites, orthogonal_reference, verified_table)

LABELS = [label for label, _, _ in VERIFIED_ARCHITECTURES]
WORDS = "the cat sat on a mat and then it ran to see what the dog did with one red ball".split()
TOKENIZER = word_level_tokenizer([" ".join(WORDS)])
VOCAB = len(TOKENIZER)

# What the attention side adds to the block input to make resid_mid: (module of the layer, how).
# "add": block input + the module's output; "add_scaled": times config.residual_multiplier (Granite);
# "output": the module's output is resid_mid itself (post-LN OPT normalises after the add).
ATTENTION_SIDE = {
    "gpt2": ("attn", "add"), "gpt_neox-sequential": ("attention", "add"),
    "gemma2": ("post_attention_layernorm", "add"), "gemma3": ("post_attention_layernorm", "add"),
    "olmo2": ("post_attention_layernorm", "add"), "granite": ("self_attn", "add_scaled"),
    "opt": ("self_attn", "add"), "opt-350m": ("self_attn_layer_norm", "output"),
    "granitemoe": ("self_attn", "add_scaled"), "exaone4": ("post_attention_layernorm", "add"),
    "glm4": ("post_self_attn_layernorm", "add"), "gpt_bigcode": ("attn", "add"),
    "falcon-sequential": ("self_attention", "add"),
    "bloom": ("self_attention", "output"),  # Bloom's attention adds the residual itself
}


PARALLEL = set(PARALLEL_LABELS)  # attention and MLP read the same input: no resid_mid


def attention_side(label: str) -> tuple[str, str] | None:
    if label in PARALLEL:
        return None
    return ATTENTION_SIDE.get(label, ("self_attn", "add"))


# Llama-layout rows whose TransformerLens bridge is steered through the same site-table path as the llama rows
# (edits on the Hugging Face modules the bridge runs): their generation and steering on transformer_lens add
# nothing the llama rows do not check, and cost a second each; their residuals are still compared below, and
# their logits and residuals at load (`interp.models.lm.verify_transformer_lens`).
SAME_PATH_AS_LLAMA = {"qwen2-tied-sliding", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "gpt_oss", "llama4_text", "smollm3",
                      "exaone", "glm", "glm4", "starcoder2", "stablelm"}


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(models, label):
    if label not in models:
        models[label] = tiny_family_lm(label, VOCAB)
    return models[label]


def batch():
    rows = [" ".join(WORDS[:9]), " ".join(WORDS[5:14])]
    encoded = [TOKENIZER(r)["input_ids"] for r in rows]
    return torch.tensor(encoded)


def _first(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def true_resid_mid(model, label, ids) -> dict[int, torch.Tensor]:
    """resid_mid of every layer rebuilt from the attention side (block input + its write), independently."""
    module_name, how = attention_side(label)
    layers = lm_sites(model).layers
    found, inputs, handles = {}, {}, []
    scale = getattr(model.config, "residual_multiplier", 1.0)
    for index, layer in enumerate(layers):
        def keep_input(module, args, kwargs, index=index):
            inputs[index] = args[0] if args else kwargs["hidden_states"]

        def on_attention(module, args, output, index=index):
            written = _first(output)
            found[index] = written if how == "output" else inputs[index] + (
                written * scale if how == "add_scaled" else written)

        handles.append(layer.register_forward_pre_hook(keep_input, with_kwargs=True))
        handles.append(getattr(layer, module_name).register_forward_hook(on_attention))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for handle in handles:
            handle.remove()
    return found


def test_the_verified_table_names_every_family_and_docs_carry_it():
    from pathlib import Path

    for _, model_type, _ in VERIFIED_ARCHITECTURES:
        assert family_of(type("C", (), {"model_type": model_type})())
    page = Path(__file__).resolve().parents[1] / "docs" / "lm-architectures.md"
    assert verified_table() in page.read_text(), "docs/lm-architectures.md is stale: paste verified_table() into it"


def test_a_model_is_matched_by_its_class_when_its_model_type_is_not_in_the_table():
    """EXAONE 3 (model_type "exaone") loads as LlamaForCausalLM: a llama by class, whatever its model_type says."""
    import transformers as T

    class OtherName(T.LlamaConfig):
        model_type = "not_in_the_table"

    config = OtherName(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)
    model = T.LlamaForCausalLM(config).eval()
    assert lm_sites(model).family.name == "llama"
    ids = batch()
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    captured = capture_residuals(model, ids, names=["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(captured["blocks.1.hook_resid_pre"], hidden[1], rtol=0, atol=0)
    with pytest.raises(LMHookError, match="no site table for model_type 'not_in_the_table'"):
        family_of(config, "SomeOtherForCausalLM")


@pytest.mark.parametrize("label", LABELS)
def test_every_residual_site_is_the_models_true_stream(models, label):
    model = model_of(models, label)
    ids = batch()
    n_layers = model.config.num_hidden_layers
    sites = model_sites(model)
    assert ("resid_mid" in sites) == (attention_side(label) is not None)
    names = residual_hook_names(n_layers, sites)
    captured = capture_residuals(model, ids, names=names)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    for layer in range(n_layers):
        torch.testing.assert_close(captured[f"blocks.{layer}.hook_resid_pre"], hidden[layer], rtol=0, atol=0)
        if layer < n_layers - 1:  # the last hidden state is after the final norm
            torch.testing.assert_close(captured[f"blocks.{layer}.hook_resid_post"], hidden[layer + 1], rtol=0, atol=0)
    if "resid_mid" in sites:
        truth = true_resid_mid(model, label, ids)
        for layer in range(n_layers):
            torch.testing.assert_close(captured[f"blocks.{layer}.hook_resid_mid"], truth[layer],
                                       rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(LMHookError, match="parallel"):
            capture_residuals(model, ids, names=["blocks.0.hook_resid_mid"])


def attention_side_write_logits(model, label, ids, vector) -> torch.Tensor:
    """Logits with ``vector`` added to resid_mid of layer 0 from positions 1 on, written on the attention side."""
    module_name, how = attention_side(label)
    layer = lm_sites(model).layers[0]
    scale = getattr(model.config, "residual_multiplier", 1.0)

    def on_attention(module, args, output):
        written = _first(output)
        change = torch.zeros_like(written)
        change[:, 1:] = vector / scale if how == "add_scaled" else vector
        new = written + change
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    handle = getattr(layer, module_name).register_forward_hook(on_attention)
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        handle.remove()


@pytest.mark.parametrize("label", LABELS)
def test_splice_and_steering_at_resid_mid_move_the_true_stream_exactly(models, label):
    from interp.hooks.lm_splice import residual_replacement
    from interp.hooks.lm_steer import LMEdit, apply_lm_edits

    model = model_of(models, label)
    if attention_side(label) is None:
        pytest.skip("no resid_mid: attention and MLP run in parallel")
    ids = batch()
    vector = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    expected = attention_side_write_logits(model, label, ids, vector)
    with torch.no_grad():
        clean = model(ids).logits
        with residual_replacement(model, "blocks.0.hook_resid_mid", lambda x: x + vector):
            spliced = model(ids).logits
        edit = LMEdit("blocks.0.hook_resid_mid", "add", direction=vector.tolist(), strength=1.0, positions="all")
        with apply_lm_edits(model, [edit], prompt_length=ids.shape[1]):
            steered_all = model(ids).logits
    assert (expected - clean).abs().max() > 1e-3  # the write matters
    torch.testing.assert_close(spliced, expected, rtol=1e-4, atol=1e-4)
    # steering adds at every position (the splice leaves the start token alone): compare from position 1 on
    # against a splice that also touches position 0
    with torch.no_grad(), residual_replacement(model, "blocks.0.hook_resid_mid", lambda x: x + vector, start=0):
        spliced_all = model(ids).logits
    torch.testing.assert_close(steered_all, spliced_all, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("label", LABELS)
def test_greedy_generation_equals_model_generate(models, label):
    from interp.models.generation import greedy_generate_tokens

    model = model_of(models, label)
    texts = [" ".join(WORDS[:6]), " ".join(WORDS[3:7])]
    ours = greedy_generate_tokens(model, TOKENIZER, texts, max_new_tokens=6, add_special_tokens=True)
    for text, tokens in zip(texts, ours):
        ids = torch.tensor([TOKENIZER(text)["input_ids"]])
        with torch.no_grad():
            reference = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=[3])
        expected = reference[0, ids.shape[1]:].tolist()
        assert tokens == expected[:len(tokens)] and (len(tokens) == len(expected) or tokens[-1] == 3)


@pytest.mark.parametrize("label", LABELS)
def test_logit_effects_are_the_true_linearised_effect(models, label):
    from interp.hooks.lm_steer import logit_effects

    model = model_of(models, label)
    d = model.config.hidden_size
    generator = torch.Generator().manual_seed(2)
    directions = torch.randn(3, d, generator=generator)
    effects = logit_effects(model, directions)
    # truth: the derivative of the model's whole forward pass along each direction, with the last layer's output
    # set to x0 + t * direction, where x0 has mean 0, root-mean-square 1 and no component along the direction
    # (there any norm divides by 1). Without a soft-cap any such x0 gives the same derivative (an independent one
    # is drawn); through Gemma 2/3's final soft-cap it depends on x0's logits, so there the cards' own reference
    # point is used (checked to be such a point)
    last = lm_sites(model).layers[-1]
    u = directions - directions.mean(1, keepdim=True)
    if getattr(model.config, "final_logit_softcapping", None):
        x0 = orthogonal_reference(directions, seed=0)
    else:
        x0 = torch.randn(3, d, generator=generator)
        x0 -= x0.mean(1, keepdim=True)
        x0 -= (x0 * u).sum(1, keepdim=True) / (u * u).sum(1, keepdim=True) * u
        x0 *= d ** 0.5 / x0.norm(dim=1, keepdim=True)
    torch.testing.assert_close(x0.mean(1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(x0.norm(dim=1), torch.full((3,), d ** 0.5), atol=1e-4, rtol=0)
    torch.testing.assert_close((x0 * u).sum(1), torch.zeros(3), atol=1e-4, rtol=0)

    def logits_at(t):
        stream = (x0 + t[:, None] * directions)[:, None, :]
        handle = last.register_forward_hook(lambda m, a, out: (stream,) + tuple(out[1:])
                                            if isinstance(out, tuple) else stream)
        try:
            return model(torch.full((3, 1), 5)).logits[:, 0]
        finally:
            handle.remove()

    # reverse mode twice (the double-vjp trick), not the forward mode `logit_effects` uses: also independent of it,
    # and it runs through Bloom's custom GeLU autograd.Function, which forward mode cannot
    _, truth = torch.autograd.functional.jvp(logits_at, (torch.zeros(3),), (torch.ones(3),))
    torch.testing.assert_close(effects, truth.detach(), rtol=1e-4, atol=1e-5)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:  # the cap bends these logits: leaving it out (as before) would not pass
        model.config.final_logit_softcapping = None
        try:
            assert (logit_effects(model, directions) - truth).abs().max() > 0.1 * truth.abs().max()
        finally:
            model.config.final_logit_softcapping = cap


@pytest.mark.parametrize("label", LABELS)
def test_transformer_lens_backend_reads_the_same_residuals_or_refuses_in_one_line(models, label, tmp_path):
    from interp.models.lm import LMError, load_lm

    model = model_of(models, label)
    model.save_pretrained(tmp_path)
    TOKENIZER.save_pretrained(tmp_path)
    hf = load_lm(tmp_path)
    try:
        tl = load_lm(tmp_path, backend="transformer_lens")
    except LMError as error:
        assert label in TRANSFORMER_LENS_REFUSED, f"{label}: {error}"
        assert "\n" not in str(error) and "--backend hf" in str(error)
        assert "computes other" in str(error) or "cannot run" in str(error)
        return
    assert label not in TRANSFORMER_LENS_REFUSED, f"{label}: TransformerLens is right now: update the table"
    sites = model_sites(hf)
    assert model_sites(tl) == sites
    if label not in SAME_PATH_AS_LLAMA:
        _generation_and_steering_agree(hf, tl, sites)
    names = residual_hook_names(hf.n_layers, sites)
    ids = batch()
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0  # right padding on one row
    ours, theirs = capture_residuals(hf, ids, mask, names), capture_residuals(tl, ids, mask, names)
    for name in names:
        torch.testing.assert_close(theirs[name][mask.bool()], ours[name][mask.bool()], rtol=1e-4, atol=1e-4)


def tiny_mamba(directory):
    """A saved tiny random Mamba (no attention, a state of its own): outside the site table."""
    import transformers as T

    torch.manual_seed(0)
    mamba = T.MambaForCausalLM(T.MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=4,
                                             pad_token_id=0, bos_token_id=2, eos_token_id=3)).eval()
    mamba.save_pretrained(directory)
    TOKENIZER.save_pretrained(directory)
    return mamba


def test_interp_hooks_lists_only_the_sites_a_model_has_and_refuses_an_unknown_family_in_one_line(models, tmp_path,
                                                                                                 capsys):
    from interp.__main__ import main

    pythia = tmp_path / "pythia"
    model_of(models, "gpt_neox").save_pretrained(pythia)
    TOKENIZER.save_pretrained(pythia)
    expected = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre",
                "blocks.1.hook_resid_post"]
    for backend in ("hf", "transformer_lens"):  # the bridge's hook points, as checked at load: no resid_mid either
        capsys.readouterr()
        assert main(["hooks", "--model", str(pythia), "--backend", backend]) == 0
        assert capsys.readouterr().out.split() == expected, backend
    tiny_mamba(tmp_path / "mamba")
    capsys.readouterr()
    assert main(["hooks", "--model", str(tmp_path / "mamba")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "no site table for model_type 'mamba'" in error
    assert "--backend transformer_lens" in error
    # on transformer_lens its logits pass the check but no residual hook point can be checked: one line saying what
    # works from there, and it does not send the user to the backend they are on
    assert main(["hooks", "--model", str(tmp_path / "mamba"), "--backend", "transformer_lens"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "could be checked" in error and "generates on --backend transformer_lens" in error
    assert "try" not in error.lower() and "--backend hf" not in error
    assert main(["hooks", "--model", "toy", "--backend", "transformer_lens"]) == 2  # not a language model
    assert "for language models" in capsys.readouterr().err


def test_a_family_outside_the_table_is_steered_and_read_out_through_the_bridges_own_hook_points(models, tmp_path,
                                                                                                monkeypatch):
    """With Phi taken out of the site table, --backend hf refuses it and --backend transformer_lens runs it through
    the bridge's own hook points (checked at load): steering at resid_post and feature cards' logit effects equal
    what the Hugging Face model itself computes, and resid_mid, which nothing could check, is refused in one line."""
    import interp.hooks.lm_sites as table
    from interp.edits import EditError
    from interp.hooks.lm_steer import LMEdit, generate, logit_effects
    from interp.models.lm import load_lm

    model = model_of(models, "phi")
    model.save_pretrained(tmp_path)
    TOKENIZER.save_pretrained(tmp_path)
    monkeypatch.setattr(table, "FAMILIES", tuple(f for f in table.FAMILIES if f.name != "phi"))
    with pytest.raises(LMHookError, match="--backend transformer_lens"):
        model_sites(load_lm(tmp_path))
    tl = load_lm(tmp_path, backend="transformer_lens")
    assert model_sites(tl) == ("resid_pre", "resid_post")
    with pytest.raises(EditError, match="has no resid_mid that could be checked") as refused:
        generate(tl, ["the cat"], [LMEdit("blocks.0.hook_resid_mid", "add", direction=[1.0] * 32)], max_new_tokens=2)
    assert "\n" not in str(refused.value) and "try" not in str(refused.value)
    # steering: the HF model's own layer 0 output plus the vector at every position, greedy by full forward passes
    vector = torch.randn(32, generator=torch.Generator().manual_seed(4)) * 40
    layer = model.model.layers[0]
    handle = layer.register_forward_hook(lambda m, a, out: (_first(out) + vector,) + tuple(out[1:])
                                         if isinstance(out, tuple) else out + vector)
    prompt = " ".join(WORDS[:6])
    ids = TOKENIZER(prompt)["input_ids"]
    try:
        with torch.no_grad():
            for _ in range(6):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    finally:
        handle.remove()
    expected = TOKENIZER.decode(ids[-6:], skip_special_tokens=True).strip()
    edit = LMEdit("blocks.0.hook_resid_post", "add", direction=vector.tolist(), strength=1.0, positions="all")
    steered = generate(tl, [prompt], [edit], max_new_tokens=6, chat_template=False)
    assert steered == [expected] and steered != generate(tl, [prompt], max_new_tokens=6, chat_template=False)
    # feature cards: the derivative of the HF model's own forward with the last layer's output set (any point of
    # mean 0, rms 1 orthogonal to the direction: no soft-cap here)
    directions = torch.randn(3, 32, generator=torch.Generator().manual_seed(2))
    x0 = orthogonal_reference(directions, seed=7)
    last = model.model.layers[-1]

    def logits_at(t):
        stream = (x0 + t[:, None] * directions)[:, None, :]
        handle = last.register_forward_hook(lambda m, a, out: (stream,) + tuple(out[1:])
                                            if isinstance(out, tuple) else stream)
        try:
            return model(torch.full((3, 1), 5)).logits[:, 0]
        finally:
            handle.remove()

    _, truth = torch.autograd.functional.jvp(logits_at, (torch.zeros(3),), (torch.ones(3),))
    torch.testing.assert_close(logit_effects(tl, directions), truth.detach(), rtol=1e-4, atol=1e-5)


def _tokenizer(adds_bos: bool, template: str | None):
    from tokenizers import processors

    tokenizer = word_level_tokenizer([" ".join(WORDS)], extra_words=["user", "assistant"])
    if not adds_bos:  # as GPT-2's and Qwen's tokenizers: no special token added
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A")
    tokenizer.chat_template = template
    return tokenizer


TEMPLATE_WITH_BOS = ("{{ bos_token }}{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}"
                     "{% if add_generation_prompt %}assistant{% endif %}")  # as Llama 3's, Gemma's
TEMPLATE_WITHOUT_BOS = TEMPLATE_WITH_BOS.replace("{{ bos_token }}", "")  # as Qwen's, SmolLM2's


@pytest.mark.parametrize("adds_bos,template", [(True, None), (False, None), (True, TEMPLATE_WITH_BOS),
                                               (False, TEMPLATE_WITHOUT_BOS)],
                         ids=["adds-bos", "no-bos", "template-with-bos", "template-without-bos"])
def test_prompts_carry_one_start_token_and_the_tokenizers_own_chat_template(models, adds_bos, template):
    from interp.hooks.lm import format_prompts
    from interp.hooks.lm_steer import prompt_texts
    from interp.lm_text import token_sequences
    from interp.models.lm import LanguageModel

    tokenizer = _tokenizer(adds_bos, template)
    model = model_of(models, "llama")
    lm = LanguageModel(model, tokenizer, n_layers=2, d_model=32, n_ctx=128, backend="hf", name="tiny")
    prompts = ["the cat sat", "a dog ran"]
    texts, add_special = prompt_texts(lm, prompts)
    encoded = tokenizer(texts, add_special_tokens=add_special)["input_ids"]
    bos = tokenizer.bos_token_id
    provides_bos = adds_bos if template is None else "bos_token" in template
    for ids in encoded:
        assert ids.count(bos) == (1 if provides_bos else 0) and (not provides_bos or ids[0] == bos)
    if template is not None:
        assert texts == [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                       add_generation_prompt=True) for p in prompts]
        assert format_prompts(tokenizer, prompts, chat_template=None) == texts
    for sequence in token_sequences(tokenizer, [" ".join(WORDS)], context=8):
        assert sequence.count(sequence[0]) == 1  # one start token, never a second from the tokenizer


def _generation_and_steering_agree(hf, tl, sites):
    """Greedy completions on both backends are the same, plain and with a steering edit at each writable site
    and each ``positions`` (the TransformerLens side decodes without a cache, told where the prompt ends)."""
    from interp.hooks.lm_steer import LMEdit, generate

    prompts = [" ".join(WORDS[:6]), " ".join(WORDS[3:7])]
    assert generate(tl, prompts, max_new_tokens=6) == generate(hf, prompts, max_new_tokens=6)
    direction = torch.randn(hf.d_model, generator=torch.Generator().manual_seed(4)).tolist()
    moved = 0
    for kind in [k for k in ("resid_mid", "resid_post") if k in sites]:
        for positions in ("prompt", "generated"):
            edit = [LMEdit(f"blocks.0.hook_{kind}", "add", direction=direction, strength=40.0, positions=positions)]
            steered = generate(hf, prompts, edit, max_new_tokens=6)
            assert generate(tl, prompts, edit, max_new_tokens=6) == steered, (kind, positions)
            moved += steered != generate(hf, prompts, max_new_tokens=6)
    assert moved  # the edits change something, so the agreement is not vacuous


@pytest.mark.parametrize("label", ["llama", "qwen2"])  # a local HookedTransformer; a TransformerBridge
def test_flowlens_commands_take_the_backend(models, label, tmp_path, capsys):
    import json

    from flowlens.__main__ import main

    model = model_of(models, label)
    model.save_pretrained(tmp_path / "model")
    TOKENIZER.save_pretrained(tmp_path / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(WORDS[i:i + 5]), "kind": "benign"}) + "\n"
                               for i in range(3)))
    completions = {}
    for backend in ("hf", "transformer_lens"):
        out = tmp_path / f"{backend}.json"
        assert main(["refusals", "--model", str(tmp_path / "model"), "--prompts", str(prompts), "--max-new-tokens",
                     "5", "--out", str(out), "--backend", backend]) == 0
        saved = json.loads(out.read_text())
        assert saved["settings"]["backend"] == backend
        completions[backend] = [row["completion"] for row in saved["rows"]]
    assert completions["transformer_lens"] == completions["hf"]
    capsys.readouterr()
    code = main(["vcl", "--model", str(tmp_path / "model"), "--data", str(prompts), "--out", str(tmp_path / "run"),
                 "--backend", "transformer_lens"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.count("\n") == 0 and "--backend hf" in error, error
    assert not (tmp_path / "run").exists()


def test_greedy_decoding_of_a_model_outside_the_table_is_checked_against_its_full_forward(tmp_path, capsys):
    """A Mamba keeps its own state and does not decode through the workbench's KV cache and padding: its cached
    logits differ from a full forward pass, so `flowlens refusals --backend hf` refuses it in one line and writes
    nothing; on transformer_lens (TransformerLens' bridge, its logits checked at load; a full pass per token) the
    completion is the model's own greedy one."""
    import json

    from flowlens.__main__ import main
    from interp.models.generation import check_cached_decoding

    mamba = tiny_mamba(tmp_path / "mamba")
    prompt = " ".join(WORDS[:5])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": prompt, "kind": "benign"}) + "\n")
    runs = {}
    for backend in ("hf", "transformer_lens"):
        out = tmp_path / f"{backend}.json"
        capsys.readouterr()
        code = main(["refusals", "--model", str(tmp_path / "mamba"), "--prompts", str(prompts),
                     "--max-new-tokens", "4", "--out", str(out), "--backend", backend])
        runs[backend] = code, out, capsys.readouterr().err.strip().splitlines()
    code, out, error = runs["hf"]
    refusal = error[-1]  # (the lines above it: transformers' loading bar)
    assert code == 2 and "mamba" in refusal and "--backend transformer_lens" in refusal and not out.exists()
    code, out, _ = runs["transformer_lens"]
    ids = TOKENIZER(prompt)["input_ids"]
    with torch.no_grad():
        for _ in range(4):  # the model's own greedy continuation: a full forward pass per token
            ids.append(int(mamba(torch.tensor([ids])).logits[0, -1].argmax()))
    expected = TOKENIZER.decode(ids[-4:], skip_special_tokens=True).strip()
    assert code == 0 and json.loads(out.read_text())["rows"][0]["completion"] == expected
    # a transformer of the table passes the same check (its cache is the suite's), so the check tells them apart
    check_cached_decoding(tiny_family_lm("cohere2", VOCAB), [TOKENIZER(" ".join(WORDS[:7]))["input_ids"]], set(), 0)
