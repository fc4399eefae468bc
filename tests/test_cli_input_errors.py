"""Issue 21, the interp, riebench and flowlens side: bad input to `python -m interp|riebench|flowlens` is a
message (exit 2), never a traceback nor silent acceptance, and the four command lines end a failure the same
way; `saes features` never rewrites the cards and image pool shipped with the repository, and a card file
carries the fingerprint of the pool its top images point into."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import flowlens.diversity
import interp.models.listing
import riebench.report
import saes.features
import saes.report
from flowlens.__main__ import main as flowlens_main
from interp.__main__ import main as interp_main
from interp.models.t2i import MAX_SEED, ModelError, check_device
from interp.shipped import MARKER, ShippedFilesError
from interp.store import ActivationStore
from zoo import WEIGHTS_DIR, shapes
from riebench.__main__ import main as riebench_main
from riebench.tasks import ShapesSuiteConfig, TaskError
from saes.__main__ import main as saes_main
from saes.features import FeaturesError, analyse
from saes.library import PRETRAINED_DIR, FeatureLibrary, LibraryError
from saes.pool import AnalysisPool, load_analysis_images, pool_fingerprint
from saes.probes import AnalysisConfig
from saes.sae import WEIGHTS_FILENAME
from test_saes_features import _identity_sae, _scenes, _tracking_updates

PROMPT = "a small red circle at the top left on a blue background"
MID = "mid_block.attentions.0"
OTHER = "up_blocks.0.attentions.0"
SHIPPED = PRETRAINED_DIR / "toy"
CHAT_WEIGHTS = WEIGHTS_DIR / "chat-safety-0.4"


@pytest.fixture
def toy_loaded(toy_t2i, monkeypatch):
    """The command lines load the session's toy model instead of loading it again."""
    monkeypatch.setattr("interp.models.load_t2i", lambda *args, **kwargs: toy_t2i)
    return toy_t2i


def run_cli(main, args: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of a command line's main(ARGS), argparse's own refusals included."""
    try:
        code = main(args)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


# ----------------------------------------------------------------------------- interp generate

@pytest.mark.parametrize("guidance", ["nan", "-5", "inf"])
def test_guidance_must_be_a_finite_scale_of_at_least_0(toy_loaded, tmp_path, capsys, guidance):
    out = tmp_path / "image.png"
    code, err = run_cli(interp_main, ["generate", "--prompt", PROMPT, "--guidance", guidance, "--out", str(out)],
                        capsys)
    assert code == 2 and "guidance must be a finite number of at least 0 (above 1: classifier-free guidance" in err
    assert not out.exists()


def test_guidance_from_0_to_1_means_no_classifier_free_guidance_and_is_accepted(toy_loaded, tmp_path, capsys):
    out = tmp_path / "image.png"
    assert run_cli(interp_main, ["generate", "--prompt", PROMPT, "--guidance", "0.5", "--out", str(out)],
                   capsys)[0] == 0
    assert out.exists()


@pytest.mark.parametrize("seed", [str(2**64), "99999999999999999999999", "-1"])
def test_a_seed_outside_the_generators_range_says_the_range(tmp_path, capsys, seed):
    code, err = run_cli(interp_main, ["generate", "--prompt", PROMPT, "--seed", seed, "--out",
                                      str(tmp_path / "image.png")], capsys)
    assert code == 2 and f"argument --seed: must be from 0 to {MAX_SEED}, got {seed}" in err


def test_generation_and_riebench_refuse_seeds_outside_the_range(toy_t2i, tmp_path):
    from riebench.methods import MethodConfig
    from riebench.runner import RunConfig, Runner
    from riebench.tasks import shapes_suite

    with pytest.raises(ModelError, match=r"a seed must be an integer from 0 to 18446744073709551615 \(2\*\*64 - 1\)"):
        toy_t2i.generate(PROMPT, seed=2**64)
    assert toy_t2i.generate(PROMPT, seed=MAX_SEED)[0].size == (64, 64)
    suite = shapes_suite(ShapesSuiteConfig(per_category=1), ["change colour"])
    with pytest.raises(ModelError, match="a seed must be an integer from 0 to"):  # before any task is generated
        Runner(RunConfig(seed=2**64, configs=[MethodConfig("prompt-swap")]), tmp_path, model=toy_t2i, suite=suite)
    assert not (tmp_path / "results").exists()


# ----------------------------------------------------------------------------- sizes and counts

@pytest.mark.parametrize("window", ["0", "-5"])
def test_diversity_window_must_be_at_least_1(tmp_path, capsys, window):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "completion": "a b c d e f a b"}) + "\n")
    out = tmp_path / "diversity.json"
    code, err = run_cli(flowlens_main, ["diversity", str(data), "--window", window, "--out", str(out)], capsys)
    assert code == 2 and f"argument --window: must be at least 1, got {window}" in err
    assert not out.exists()
    with pytest.raises(ValueError, match="the MSTTR window must be a whole number of tokens, at least 1"):
        flowlens.diversity.lexical_diversity(["a b c"], msttr_window=int(window))


def test_absurd_sizes_are_refused_at_once_with_the_limit(tmp_path, capsys):
    code, err = run_cli(interp_main, ["collect", "--world", "100000000", "--out", str(tmp_path / "store")], capsys)
    assert code == 2 and "argument --world: must be from 1 to 1000000, got 100000000" in err
    code, err = run_cli(riebench_main, ["tasks", "--per-category", "10000000", "--out", str(tmp_path / "t.json")],
                        capsys)
    assert code == 2 and "argument --per-category: must be from 1 to 1000, got 10000000" in err
    with pytest.raises(TaskError, match="per_category must be from 1 to 1000, not 1001"):
        ShapesSuiteConfig(per_category=1001).validate()
    assert not (tmp_path / "store").exists() and not (tmp_path / "t.json").exists()


def test_collect_refuses_seeds_past_the_range_before_loading_a_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("interp.models.load_t2i", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    code, err = run_cli(interp_main, ["collect", "--world", "3", "--seed", str(MAX_SEED - 1), "--out",
                                      str(tmp_path / "store")], capsys)
    assert code == 2 and f"with 3 images needs seeds up to {MAX_SEED + 1}, past the largest seed" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_collect_on_cuda_without_cuda_is_a_message(tmp_path, capsys):
    code, err = run_cli(interp_main, ["collect", "--world", "2", "--device", "cuda", "--out", str(tmp_path / "s")],
                        capsys)
    assert code == 2 and "device 'cuda' is not available" in err and "use --device cpu" in err
    assert not (tmp_path / "s").exists()
    with pytest.raises(ModelError, match="device 'cuda:1' is not available"):
        check_device("cuda:1")


def test_an_unknown_device_is_a_message():
    with pytest.raises(ModelError, match="unknown device 'gpu0': use cpu, cuda or cuda:N"):
        check_device("gpu0")
    check_device("cpu")


# ----------------------------------------------------------------------------- default blocks

@functools.cache
def pipeline_lacking_a_block() -> str:
    """A saved pipeline (no recipe) whose U-Net has one attention per down block: no down_blocks.2.attentions.1."""
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

    from test_hooks_diffusion import random_t2i

    pipe = random_t2i().pipe
    torch.manual_seed(0)
    unet = UNet2DConditionModel.from_config({**pipe.unet.config, "layers_per_block": 1})
    directory = Path(tempfile.mkdtemp(prefix="interp-fewer-blocks-"))
    StableDiffusionXLPipeline(**{**pipe.components, "unet": unet}).save_pretrained(directory)
    return str(directory)


def test_collect_and_riebench_default_to_the_blocks_the_model_lists(tmp_path, capsys):
    model = pipeline_lacking_a_block()
    assert interp_main(["blocks", "--model", model]) == 0
    listed = json.loads(capsys.readouterr().out)["default_blocks"]
    assert listed == [MID, OTHER, "up_blocks.0.attentions.1"]
    code, _ = run_cli(interp_main, ["collect", "--model", model, "--world", "2", "--steps", "1", "--out",
                                    str(tmp_path / "store")], capsys)
    assert code == 0 and ActivationStore(tmp_path / "store").blocks == listed
    rie = ["--method", "prompt-swap", "--category", "change colour", "--limit-per-category", "1", "--steps", "1"]
    # A pipeline made outside the shapes world cannot be scored on its suite: refused in one line (issue 30).
    code, err = run_cli(riebench_main, ["run", "--model", model, *rie, "--out", str(tmp_path / "refused")], capsys)
    assert code == 2 and "has no ground truth" in err and not (tmp_path / "refused" / "run.json").exists()
    # Saved by the toy's recipe (recipe.json), the same pipeline is the shapes world's: riebench runs on the blocks
    # the model lists.
    shapes_model = tmp_path / "recipe-made"
    shutil.copytree(model, shapes_model)
    (shapes_model / "recipe.json").write_text("{}")
    assert interp_main(["blocks", "--model", str(shapes_model)]) == 0
    listed = json.loads(capsys.readouterr().out)["default_blocks"]
    code, _ = run_cli(riebench_main, ["run", "--model", str(shapes_model), *rie, "--out", str(tmp_path / "rie")],
                      capsys)
    assert code == 0
    assert json.loads((tmp_path / "rie" / "run.json").read_text())["run"]["configs"][0]["blocks"] == listed


# ----------------------------------------------------------------------------- damaged and unsafe weights

class _Payload:
    """Unpickled, it would create the file `marker`: what a malicious pickle could do instead."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


# The pickle a loader falls back to when a model directory has no safetensors file.
PICKLE_NAMES = {"model.safetensors": "pytorch_model.bin",  # transformers
                "diffusion_pytorch_model.safetensors": "diffusion_pytorch_model.bin"}  # diffusers


def _damage(directory: Path, weights: str, damage: str, marker: Path) -> Path:
    """Truncate the weights file in a copy of a model directory, or put a malicious pickle in its place;
    returns the file the loader fails on."""
    path = directory / weights
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:5000])
        return path
    path.unlink()
    torch.save({"weight": _Payload(marker)}, directory / PICKLE_NAMES[weights])
    return directory / PICKLE_NAMES[weights]


def _flowlens_args(command: str, model: Path, tmp_path: Path) -> list[str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"add {i} and 2", "kind": "general", "answer": str(i + 2)})
                               + "\n" for i in range(4)))
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"add {i} and 1", "completion": str(i + 1)}) + "\n"
                            for i in range(4)))
    return {"analyze": ["analyze", "--prompts", str(prompts), "--out", str(tmp_path / "analysis")],
            "refusals": ["refusals", "--prompts", str(prompts), "--out", str(tmp_path / "refusals.json")],
            "vcl": ["vcl", "--data", str(data), "--steps", "1", "--batch-size", "2", "--k", "1", "--max-length", "64",
                    "--out", str(tmp_path / "vcl")]}[command] + ["--model", str(model)]


@pytest.mark.parametrize("damage", ["truncate", "pickle"])
@pytest.mark.parametrize("command", ["analyze", "refusals", "vcl"])
def test_flowlens_damaged_or_unsafe_model_weights_are_a_message_naming_the_file(tmp_path, capsys, command, damage):
    model = tmp_path / "model"
    shutil.copytree(CHAT_WEIGHTS, model)
    marker = tmp_path / "pwned"
    bad = _damage(model, "model.safetensors", damage, marker)
    code, err = run_cli(flowlens_main, _flowlens_args(command, model, tmp_path), capsys)
    assert code == 2 and f"error: cannot read {bad}: " in err
    assert ("it is not a readable safetensors file (Error while deserializing header" if damage == "truncate" else
            "torch.load refused it (Unsupported global: GLOBAL io.open was not an allowed global by default)") in err
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "pickle"])
def test_a_damaged_or_unsafe_vcl_checkpoint_is_a_message_naming_it(tmp_path, capsys, damage):
    args = _flowlens_args("vcl", CHAT_WEIGHTS, tmp_path)
    checkpoint = tmp_path / "vcl" / "checkpoint.pt"
    checkpoint.parent.mkdir()
    marker = tmp_path / "pwned"
    if damage == "truncate":
        torch.save({"step": torch.zeros(1000)}, checkpoint)
        checkpoint.write_bytes(checkpoint.read_bytes()[:2000])
    else:
        torch.save({"step": _Payload(marker)}, checkpoint)
    code, err = run_cli(flowlens_main, args, capsys)
    assert code == 2 and f"error: cannot read {checkpoint}: " in err and "delete it, and the run starts over" in err
    assert ("not a readable torch checkpoint (PytorchStreamReader failed reading zip archive" if damage == "truncate"
            else "torch.load refused it (Unsupported global: GLOBAL io.open") in err
    assert not marker.exists()


def test_riebench_run_with_damaged_sae_weights_is_a_message_naming_the_file(toy_loaded, tmp_path, capsys):
    saes_dir = tmp_path / "saes"
    shutil.copytree(SHIPPED / MID, saes_dir / MID)
    weights = saes_dir / MID / WEIGHTS_FILENAME
    weights.write_bytes(weights.read_bytes()[:1000])
    code, err = run_cli(riebench_main, ["run", "--saes", str(saes_dir), "--blocks", MID, "--limit-per-category", "1",
                                        "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and f"{weights} is not a readable safetensors file" in err


def test_riebench_run_on_a_model_with_an_unsafe_pickle_is_a_message_naming_it(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(WEIGHTS_DIR / "t2i", model)
    marker = tmp_path / "pwned"
    bad = _damage(model / "unet", "diffusion_pytorch_model.safetensors", "pickle", marker)
    code, err = run_cli(riebench_main, ["run", "--model", str(model), "--method", "prompt-swap", "--out",
                                        str(tmp_path / "run")], capsys)
    assert code == 2 and f"Unable to load weights from checkpoint file for '{bad}'" in err
    assert not marker.exists()


# ----------------------------------------------------------------------------- one behaviour for four CLIs

CLIS = {"interp": (interp_main, ["blocks"], interp.models.listing, "blocks_command"),
        "saes": (saes_main, ["report", "--root", "x"], saes.report, "report_command"),
        "riebench": (riebench_main, ["report", "x"], riebench.report, "report_command"),
        "flowlens": (flowlens_main, ["diversity", "x"], flowlens.diversity, "diversity_command")}


def _raising(error: BaseException):
    def command(args):
        raise error

    return command


@pytest.mark.parametrize("cli", list(CLIS))
def test_the_four_command_lines_end_failures_the_same_way(cli, capsys, monkeypatch):
    from safetensors import SafetensorError

    main, argv, module, name = CLIS[cli]
    for error, code, message in [(KeyboardInterrupt(), 130, "interrupted"),
                                 (ValueError("a bad value"), 2, "error: a bad value"),
                                 (FileNotFoundError("no such file: x"), 2, "error: no such file: x"),
                                 (SafetensorError("header too large"), 2,
                                  "error: cannot read a weights file: it is not a readable safetensors file")]:
        monkeypatch.setattr(module, name, _raising(error))
        got, err = run_cli(main, argv, capsys)
        assert (got, err.splitlines()[0][:len(message)]) == (code, message), (cli, error)
    monkeypatch.setattr(module, name, _raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # a bug keeps its traceback
        main(argv)


# ----------------------------------------------------------------------------- shipped cards and pools

def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_features_refuses_to_rewrite_the_shipped_cards_and_pool(tmp_path, capsys, monkeypatch):
    before = _digests(SHIPPED)
    monkeypatch.setattr(saes.features, "load_model", lambda args: pytest.fail("refused only after loading"))
    code, err = run_cli(saes_main, ["features", "--sae", str(SHIPPED / MID), "--world", "2", "--out",
                                    str(tmp_path / "out")], capsys)
    assert code == 2 and "would rewrite files shipped with the repository" in err and "--overwrite" in err
    code, err = run_cli(saes_main, ["report", "--root", str(SHIPPED)], capsys)
    assert code == 2 and "saes report would rewrite files shipped with the repository" in err
    assert _digests(SHIPPED) == before


def _pool(n: int, seed: int, blocks=(MID, OTHER)) -> AnalysisPool:
    """A pool of n rendered shapes-world scenes; each block gets the same known updates."""
    scenes = _scenes(n, seed=seed)
    rng = np.random.default_rng(seed)
    updates = _tracking_updates(scenes, noise_seed=seed)
    return AnalysisPool(np.stack([shapes.render(s) for s in scenes]), [shapes.caption(s, rng) for s in scenes],
                        list(range(n)), {b: updates for b in blocks})


def _analysed_root(tmp_path: Path) -> Path:
    """Two blocks' SAEs analysed together: their cards and the pool they share."""
    root = tmp_path / "toy"
    saes_ = {}
    for block in (MID, OTHER):
        sae = _identity_sae(4)
        sae.save(root / block)
        saes_[block] = (sae, root / block)
    analyse(saes_, _pool(30, seed=1), "toy", tmp_path / "html", AnalysisConfig(n_top_images=3))
    return root


def test_analyse_refuses_shipped_directories(tmp_path):
    shipped = tmp_path / "shipped"
    _identity_sae(4).save(shipped / MID)
    (shipped / MARKER).write_text("shipped\n")  # a copy of a shipped root: the marker protects it
    before = _digests(shipped)
    with pytest.raises(ShippedFilesError, match="would rewrite files shipped with the repository"):
        analyse({MID: (_identity_sae(4), shipped / MID)}, _pool(8, seed=2, blocks=(MID,)), "toy", tmp_path / "out")
    assert _digests(shipped) == before
    analyse({MID: (_identity_sae(4), shipped / MID)}, _pool(8, seed=2, blocks=(MID,)), "toy", tmp_path / "out",
            overwrite=True)
    assert (shipped / "analysis_images.npz").exists()


def test_a_new_pool_that_would_orphan_other_blocks_cards_is_refused(tmp_path):
    root = _analysed_root(tmp_path)
    before = _digests(root)
    one_block = {MID: (_identity_sae(4), root / MID)}
    with pytest.raises(FeaturesError, match=rf"would leave the cards of other blocks \({root / OTHER}/features.json\)"):
        analyse(one_block, _pool(12, seed=3), "toy", tmp_path / "html")
    assert _digests(root) == before
    analyse(one_block, _pool(30, seed=1), "toy", tmp_path / "html")  # the same pool again orphans nothing
    assert FeatureLibrary(root).cards(OTHER)
    analyse(one_block, _pool(12, seed=3), "toy", tmp_path / "html", overwrite=True)
    with pytest.raises(LibraryError, match=rf"{root / OTHER}/features.json was made on another image pool"):
        FeatureLibrary(root)


def test_cards_carry_their_pools_fingerprint_and_legacy_cards_are_checked_by_size(tmp_path):
    root = _analysed_root(tmp_path)
    images, prompts = load_analysis_images(root)
    cards_path = root / OTHER / "features.json"
    cards = json.loads(cards_path.read_text())
    assert cards["pool_sha256"] == pool_fingerprint(images, prompts)
    legacy = {k: v for k, v in cards.items() if k != "pool_sha256"}
    cards_path.write_text(json.dumps(legacy))
    assert FeatureLibrary(root).cards(OTHER) == cards["features"]  # fits the pool: loads
    legacy["features"][0]["top_images"][0]["index"] = len(images)
    cards_path.write_text(json.dumps(legacy))
    with pytest.raises(LibraryError, match="made on another image pool"):
        FeatureLibrary(root)


def test_the_shipped_cards_carry_the_shipped_pools_fingerprint():
    fingerprint = pool_fingerprint(*load_analysis_images(SHIPPED))
    for path in sorted(SHIPPED.glob("*/features.json")):
        assert json.loads(path.read_text())["pool_sha256"] == fingerprint, path
    assert FeatureLibrary.for_model("toy").cards(MID)
