"""Issue 21, the interp, riebench and flowlens side: the four command lines (`python -m
interp|saes|riebench|flowlens`) end a failure the same way, and a damaged or unsafe weights file is a
message naming it (exit 2), never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import flowlens.diversity
import interp.__main__
import riebench.__main__
import saes.__main__
from flowlens.__main__ import main as flowlens_main
from interp.__main__ import main as interp_main
from interp.zoo import WEIGHTS_DIR
from riebench.__main__ import main as riebench_main
from saes.__main__ import main as saes_main
from saes.library import PRETRAINED_DIR
from saes.sae import WEIGHTS_FILENAME

MID = "mid_block.attentions.0"
SHIPPED = PRETRAINED_DIR / "toy"
CHAT_WEIGHTS = WEIGHTS_DIR / "chat-safety-0.4"


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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

CLIS = {"interp": (interp_main, ["blocks"], interp.__main__, "_blocks"),
        "saes": (saes_main, ["report", "--root", "x"], saes.__main__, "_report"),
        "riebench": (riebench_main, ["report", "x"], riebench.__main__, "_report"),
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
