"""The analyze command end to end on tiny random models saved to disk."""

from __future__ import annotations

import json

import pytest

from flowlens.__main__ import main
from flowlens.tiny import tiny_gpt2, tiny_llama, word_level_tokenizer

PROMPTS = ["how do i kill a python process ?", "what is two plus two ?", "how do i shoot a photo ?",
           "tell me about the war .", "where does the queen live ?", "how do i make a bomb ?"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    tokenizer = word_level_tokenizer(PROMPTS)
    for name, model in [("llama", tiny_llama(len(tokenizer), hidden_size=32, layers=4, seed=1)),
                        ("llama2", tiny_llama(len(tokenizer), hidden_size=32, layers=4, seed=2)),
                        ("gpt2", tiny_gpt2(len(tokenizer), hidden_size=16, layers=2))]:
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    yield root
    torch.set_num_threads(threads)


def test_analyze_writes_json_png_and_html(models, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "out"
    assert main(["analyze", "--model", str(models / "llama"), "--reference", str(models / "llama2"),
                 "--prompts", str(prompts), "--out", str(out)]) == 0
    result = json.loads((out / "analysis.json").read_text())
    assert (result["n_prompts"], result["n_layers"], result["width"]) == (6, 4, 32)
    assert len(result["alignment"]["score"]) == 4 and len(result["pc1_stability"]["per_layer"]) == 4
    assert all(0 <= r <= 1 + 1e-9 for r in result["concentration"]["top_k_energy"])
    assert (out / "geometry.png").stat().st_size > 0 and (out / "geometry.html").stat().st_size > 0


def test_reference_of_another_width_and_empty_prompts_are_clear_errors(models, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    assert main(["analyze", "--model", str(models / "llama"), "--reference", str(models / "gpt2"),
                 "--prompts", str(prompts), "--out", str(tmp_path / "o"), "--no-stability"]) == 2
    assert "width 16 but the model has width 32" in capsys.readouterr().err
    prompts.write_text("")
    assert main(["analyze", "--model", str(models / "llama"), "--prompts", str(prompts),
                 "--out", str(tmp_path / "o")]) == 2
    assert "empty" in capsys.readouterr().err
