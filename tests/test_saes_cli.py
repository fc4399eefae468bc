"""`python -m saes`: train and eval end to end on an activation store, bad input, import."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from saes.__main__ import main
from saes.sae import SAE

REPO = Path(__file__).resolve().parents[1]
MID = "mid_block.attentions.0"


@functools.cache
def small_store() -> Path:
    """Block updates of a random-weight pipeline of the toy model's sizes: 8 images, one step."""
    collect = pytest.importorskip("interp.collect")
    from test_hooks_diffusion import random_t2i

    from zoo.shapes import world_prompts

    out = Path(tempfile.mkdtemp(prefix="saes-store-")) / "store"
    plan = collect.CollectionPlan(model="random", blocks=[MID], prompts=world_prompts(8), seeds=list(range(8)),
                                  steps=1, guidance=0.0, images_per_shard=4)
    collect.collect(random_t2i(), plan, out, progress=False)
    return out


def test_train_then_eval_on_an_activation_store(tmp_path, capsys):
    store = small_store()
    out = tmp_path / "sae"
    args = ["train", "--store", str(store), "--block", MID, "--out", str(out), "--d-sae", "128", "--k", "8",
            "--batch-size", "64", "--lr", "3e-3", "--tokens", str(64 * 60), "--dead-after-tokens", "2000",
            "--log-every", "10", "--checkpoint-every", "20", "--threads", "1"]
    assert main(args) == 0
    sae = SAE.load(out)
    assert (sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.k) == (64, 128, 8)
    assert sae.cfg.metadata["hook_name"] == MID
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 60 and log[-1]["explained_variance"] > log[0]["explained_variance"]

    assert main(["eval", "--sae", str(out), "--store", str(store)]) == 0  # block taken from the SAE
    result = json.loads((out / "eval.json").read_text())
    assert result["block"] == MID and result["tokens"] == 8 * 64
    assert 0.5 < result["explained_variance"] <= 1.0 and result["l0"] <= 8
    assert 0 <= result["dead_features"] <= 128
    assert "| explained variance |" in (out / "eval.md").read_text()
    assert "explained variance" in capsys.readouterr().out

    # Running the finished command again resumes at the end: no more steps, same SAE.
    assert main(args) == 0
    torch.testing.assert_close(SAE.load(out).W_dec, sae.W_dec)


def test_cli_errors_are_messages_not_tracebacks(tmp_path, capsys):
    store = small_store()
    assert main(["train", "--store", str(store), "--block", "no.such.block", "--out", str(tmp_path / "a")]) == 2
    assert "not in the store" in capsys.readouterr().err
    assert main(["train", "--store", str(store), "--block", MID, "--out", str(tmp_path / "b"), "--d-sae", "16",
                 "--k", "32"]) == 2
    assert "k=32 must be between 1 and the number of latents" in capsys.readouterr().err
    assert main(["eval", "--sae", str(tmp_path / "missing"), "--store", str(store)]) == 2
    assert "is not an SAE directory" in capsys.readouterr().err


def test_import_sdxl_command_writes_a_loadable_sae(tmp_path):
    d_in, d_sae = 16, 40
    state = {"pre_bias": torch.randn(d_in), "latent_bias": torch.zeros(d_sae),
             "encoder.weight": torch.randn(d_sae, d_in), "decoder.weight": torch.randn(d_in, d_sae)}
    torch.save(state, tmp_path / "state_dict.pth")
    assert main(["import-sdxl", "--checkpoint", str(tmp_path / "state_dict.pth"), "--out", str(tmp_path / "out"),
                 "--block", "unet.up_blocks.0.attentions.1"]) == 0
    sae = SAE.load(tmp_path / "out")
    assert sae.cfg.k == 10 and sae.cfg.metadata["hook_name"] == "unet.up_blocks.0.attentions.1"


def test_help_lists_the_commands():
    done = subprocess.run([sys.executable, "-m", "saes", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0
    commands = ("train", "eval", "features", "causal", "report", "probe", "import-sdxl", "bench")
    assert all(command in done.stdout for command in commands)


def test_probe_finds_where_the_toy_codes_shape_and_colour_before_any_sae(tmp_path, capsys):
    """`python -m saes probe`: the check of a (re)trained model before SAEs are trained on it. On the embedded toy
    it finds shape in up_blocks.1.attentions.1 and colour in up_blocks.1.attentions.2 (docs/saes.md, REPORT.md)."""
    from interp.models.t2i import TOY_BLOCKS

    assert main(["probe", "--model", "toy", "--images", "60", "--out", str(tmp_path)]) == 0
    probes = json.loads((tmp_path / "probes.json").read_text())
    accuracy = {b: {a: r["accuracy"] for a, r in entry.items()} for b, entry in probes["block_probes"].items()}
    assert set(TOY_BLOCKS) <= set(accuracy)  # every hookable block, not only the analysed ones
    assert max(accuracy, key=lambda b: accuracy[b]["shape"]) == "up_blocks.1.attentions.1"
    assert max(accuracy, key=lambda b: accuracy[b]["colour"]) == "up_blocks.1.attentions.2"
    colour_ceiling = probes["direction_ceiling"]["up_blocks.1.attentions.2"]
    assert min(v for k, v in colour_ceiling.items() if k.startswith("colour=")) > 0.85
    assert 1.5 < probes["block_probes"]["up_blocks.1.attentions.2"]["colour"]["dims"] < 3  # the hue plane
    # the colours with no SAE feature of their own are those nearest to a mixture of the others (notes.md)
    mixture = {k.split("=")[1]: v for k, v in probes["mixture_distance"]["up_blocks.1.attentions.2"].items()
               if k.startswith("colour=")}
    assert set(sorted(mixture, key=mixture.get)[:3]) == {"purple", "orange", "brown"}
    md = (tmp_path / "PROBES.md").read_text()
    assert md == capsys.readouterr().out and "| up_blocks.1.attentions.2 | **" in md


def test_report_of_the_shipped_saes_end_to_end(tmp_path, capsys):
    """`python -m saes report` on few images: every SAE block measured, every hookable block probed (with a
    column that marks the SAE blocks), the one-direction ceiling for the SAE blocks, and the notes appended."""
    from interp.models.t2i import TOY_BLOCKS

    root = REPO / "saes" / "pretrained" / "toy"
    notes = tmp_path / "notes.md"
    notes.write_text("### A note\n\nmeasured here.")
    argv = ["report", "--model", "toy", "--root", str(root), "--features-summary", str(root / "features_summary.json"),
            "--eval-images", "12", "--fidelity-images", "2", "--notes-file", str(notes), "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted(report["blocks"]) == sorted(TOY_BLOCKS)
    assert all(0 < entry["explained_variance"] <= 1 for entry in report["blocks"].values())
    assert set(report["block_probes"]) > set(TOY_BLOCKS) and sorted(report["direction_ceiling"]) == sorted(TOY_BLOCKS)
    md = (tmp_path / "REPORT.md").read_text()
    assert "| block | SAE |" in md and "| up_blocks.1.attentions.0 | |" in md and md.rstrip().endswith("measured here.")
    assert "model_weights_sha256" in report and md == capsys.readouterr().out
