"""Issue 21, the saes side: diverged training stops and keeps the last good files, every JSON file written is
strict, a resumed run's log has strictly increasing steps, and bad input to `python -m saes` is a message
(exit 2), never a traceback nor silent acceptance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import saes.train as train_module
from saes.__main__ import main
from saes.evaluate import evaluate
from saes.sae import SAE, WEIGHTS_FILENAME, SAEFormatError
from saes.strict_json import NonFiniteError, write_json
from saes.train import CHECKPOINT_FILENAME, LOG_FILENAME, TrainingDivergedError, train
from saes.trainers import TopKTrainer
from test_cli_input_errors import run_cli as run_any_cli
from test_saes_cli import MID, small_store
from test_saes_train import sparse_dictionary_stream, small_config


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of `python -m saes ARGS`, argparse's own refusals included."""
    return run_any_cli(main, args, capsys)


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as a browser's JSON.parse does."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def train_args(out: Path, *extra: str) -> list[str]:
    return ["train", "--store", str(small_store()), "--block", MID, "--out", str(out), "--d-sae", "128", "--k", "8",
            "--batch-size", "64", "--tokens", str(64 * 20), "--log-every", "5", "--checkpoint-every", "10",
            "--threads", "1", *extra]


def sae_files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in ("cfg.json", WEIGHTS_FILENAME, "train_summary.json")}


# ----------------------------------------------------------------------------- divergence

def test_diverged_cli_run_exits_2_and_leaves_the_trained_sae_as_it_was(tmp_path, capsys):
    out = tmp_path / "sae"
    assert run_cli(train_args(out), capsys)[0] == 0
    before = sae_files(out)
    code, err = run_cli(train_args(out, "--lr", "10", "--restart"), capsys)  # explodes at once
    assert code == 2
    assert "training diverged at step 2 (explained variance" in err and "Lower the learning rate" in err
    assert sae_files(out) == before


@pytest.mark.parametrize("nan_after", [30, 50])  # 30: the next step's loss is NaN; 50: a checkpoint is due
def test_weights_turning_nan_stop_training_and_keep_the_last_good_checkpoint(tmp_path, monkeypatch, nan_after):
    train(small_config(total_tokens=256 * 100, checkpoint_every_steps=50, log_every_steps=10),
          sparse_dictionary_stream(300), tmp_path, progress=False)
    checkpoint, before = (tmp_path / CHECKPOINT_FILENAME).read_bytes(), sae_files(tmp_path)
    real_step, calls = TopKTrainer.step, []

    def step_then_blow_up(self, batch):
        metrics = real_step(self, batch)
        calls.append(1)
        if len(calls) == nan_after:
            with torch.no_grad():
                self.sae.encoder_weight[0, 0] = float("nan")
        return metrics

    monkeypatch.setattr(TopKTrainer, "step", step_then_blow_up)
    longer = small_config(total_tokens=256 * 200, checkpoint_every_steps=50, log_every_steps=10)
    expected = "step 131 .loss nan" if nan_after == 30 else r"step 150 .NaN or Inf in encoder_weight"
    with pytest.raises(TrainingDivergedError, match=expected) as raised:
        train(longer, sparse_dictionary_stream(300), tmp_path, progress=False)
    assert "the checkpoint of step 100" in str(raised.value)
    assert (tmp_path / CHECKPOINT_FILENAME).read_bytes() == checkpoint
    assert sae_files(tmp_path) == before


# ----------------------------------------------------------------------------- strict JSON

def test_every_json_file_of_train_and_eval_is_strict(tmp_path, capsys):
    out = tmp_path / "sae"
    assert run_cli(train_args(out), capsys)[0] == 0
    assert run_cli(["eval", "--sae", str(out), "--store", str(small_store())], capsys)[0] == 0
    for path in out.glob("*.json"):
        strict_json(path.read_text())
    for line in (out / LOG_FILENAME).read_text().splitlines():
        strict_json(line)


def test_the_saes_package_writes_json_only_through_strict_json():
    package = Path(__file__).resolve().parents[1] / "saes"
    direct = [f"{path.name}:{number}" for path in sorted(package.glob("*.py")) if path.name != "strict_json.py"
              for number, line in enumerate(path.read_text().splitlines(), 1) if "json.dump" in line]
    assert not direct, f"json.dumps allows NaN; write through saes.strict_json instead: {direct}"


def test_a_nan_is_an_error_naming_where_it_is_and_the_old_file_stays(tmp_path):
    path = tmp_path / "result.json"
    write_json(path, {"ok": 1.0})
    with pytest.raises(NonFiniteError, match=r"not writing .*result.json: scores\[1\] is nan"):
        write_json(path, {"scores": [0.5, float("nan")]})
    assert strict_json(path.read_text()) == {"ok": 1.0}


def test_eval_of_a_diverged_sae_writes_no_json(tmp_path, capsys):
    trained = tmp_path / "trained"
    assert run_cli(train_args(trained), capsys)[0] == 0
    sae = SAE.load(trained)
    with torch.no_grad():  # finite weights whose products overflow float32: the reconstruction is not finite
        sae.W_enc.mul_(1e30)
        sae.W_dec.mul_(1e30)
    sae.save(tmp_path / "overflowing")
    code, err = run_cli(["eval", "--sae", str(tmp_path / "overflowing"), "--store", str(small_store())], capsys)
    assert code == 2 and "reconstruction holds NaN or Inf" in err
    assert not (tmp_path / "overflowing" / "eval.json").exists()
    with torch.no_grad():
        sae.W_dec[0, 0] = float("nan")
    sae.save(tmp_path / "nan")
    code, err = run_cli(["eval", "--sae", str(tmp_path / "nan"), "--store", str(small_store())], capsys)
    assert code == 2 and "NaN or Inf in W_dec (1 values)" in err
    assert not (tmp_path / "nan" / "eval.json").exists()


# ----------------------------------------------------------------------------- resumed log

def test_resumed_run_logs_each_step_once(tmp_path):
    config = small_config(total_tokens=256 * 200, checkpoint_every_steps=50, log_every_steps=10)

    def killed_at_step_130():
        for i, batch in enumerate(sparse_dictionary_stream(300)):
            if i == 130:
                raise RuntimeError("killed")  # no KeyboardInterrupt handler runs: the checkpoint stays at 100
            yield batch

    with pytest.raises(RuntimeError, match="killed"):
        train(config, killed_at_step_130(), tmp_path, progress=False)
    log_path = tmp_path / LOG_FILENAME
    assert [json.loads(line)["step"] for line in log_path.read_text().splitlines()][-1] == 130
    with log_path.open("a") as f:
        f.write('{"step": 14')  # a line cut short by the kill
    train(config, sparse_dictionary_stream(300), tmp_path, progress=False)
    steps = [strict_json(line)["step"] for line in log_path.read_text().splitlines()]
    assert steps == list(range(10, 201, 10))


# ----------------------------------------------------------------------------- CLI errors

def test_unet_prefix_shown_in_the_help_is_accepted(tmp_path, capsys):
    assert run_cli(train_args(tmp_path / "sae", "--block", f"unet.{MID}"), capsys)[0] == 0
    assert SAE.load(tmp_path / "sae").cfg.metadata["hook_name"] == MID  # the store's name for it
    assert run_cli(["eval", "--sae", str(tmp_path / "sae"), "--store", str(small_store()), "--block", f"unet.{MID}"],
                   capsys)[0] == 0


@pytest.mark.parametrize("extra,message", [
    (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["--option", "frobnicate=3"], "unknown option 'frobnicate' for the topk architecture; its options are: "
                                   "adam_beta1"),
    (["--option", "lr=3"], "lr is not an architecture option: it comes from --lr"),
    (["--architecture", "standard", "--option", "frobnicate=3"], "unknown option 'frobnicate' for the standard"),
    (["--d-sae", "1000000000000"], "need at least 2.3 PiB of memory to train; this machine has"),
])
def test_bad_train_settings_are_refused_with_a_message(tmp_path, capsys, extra, message):
    code, err = run_cli(train_args(tmp_path / "sae", *extra), capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "sae" / WEIGHTS_FILENAME).exists()


@pytest.mark.parametrize("extra,message", [(["--tokens", "0"], "argument --tokens: must be at least 1, got 0"),
                                           (["--world", "-1", "--model", "toy"], "argument --world: must be at least 1")])
def test_bad_eval_settings_are_refused_with_a_message(tmp_path, capsys, extra, message):
    trained = tmp_path / "sae"
    assert run_cli(train_args(trained), capsys)[0] == 0
    code, err = run_cli(["eval", "--sae", str(trained), "--store", str(small_store()), *extra], capsys)
    assert code == 2 and message in err
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        evaluate(SAE.load(trained), sparse_dictionary_stream(1), max_tokens=0)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_sae_weights_are_a_message(tmp_path, capsys, damage):
    trained = tmp_path / "sae"
    assert run_cli(train_args(trained), capsys)[0] == 0
    weights = trained / WEIGHTS_FILENAME
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        weights.write_bytes(b"not safetensors at all")
    code, err = run_cli(["eval", "--sae", str(trained), "--store", str(small_store())], capsys)
    assert code == 2 and f"{weights} is not a readable safetensors file" in err
    with pytest.raises(SAEFormatError, match="truncated or corrupt"):
        SAE.load(trained)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_store_shard_is_a_message_naming_it(tmp_path, capsys, damage):
    store = tmp_path / "store"
    shutil.copytree(small_store(), store)
    shard = store / "shards" / "shard-000001.safetensors"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2:]
    else:
        data[len(data) - 100] ^= 0x40  # one bit inside the tensor data; the length is unchanged
    shard.write_bytes(bytes(data))
    code, err = run_cli(["train", "--store", str(store), "--block", MID, "--out", str(tmp_path / "sae"),
                         "--d-sae", "32", "--k", "4", "--batch-size", "64", "--tokens", "2000", "--threads", "1"],
                        capsys)
    assert code == 2 and "shard shards/shard-000001.safetensors of the store" in err
    assert ("does not match its sha256" if damage == "flip" else "cannot be read") in err
    assert "delete it and run the collect command that made the store again" in err


def test_corrupt_training_checkpoint_is_a_message(tmp_path, capsys):
    out = tmp_path / "sae"
    assert run_cli(train_args(out), capsys)[0] == 0
    (out / CHECKPOINT_FILENAME).write_bytes(b"junk")
    code, err = run_cli(train_args(out), capsys)
    assert code == 2 and "checkpoint.pt cannot be read" in err and "--restart" in err


def _openai_checkpoint(directory: Path, nan: bool = False) -> Path:
    d_in, d_sae = 16, 40
    state = {"pre_bias": torch.randn(d_in), "latent_bias": torch.zeros(d_sae),
             "encoder.weight": torch.randn(d_sae, d_in), "decoder.weight": torch.randn(d_in, d_sae)}
    if nan:
        state["encoder.weight"][2, 3] = float("nan")
    directory.mkdir()
    torch.save(state, directory / "state_dict.pth")
    return directory


def test_import_sdxl_refuses_k_0_and_nan_weights(tmp_path, capsys):
    code, err = run_cli(["import-sdxl", "--checkpoint", str(_openai_checkpoint(tmp_path / "a")), "--out",
                         str(tmp_path / "out-a"), "--k", "0"], capsys)
    assert code == 2 and "needs 0 < k <= d_sae, got k=0" in err
    code, err = run_cli(["import-sdxl", "--checkpoint", str(_openai_checkpoint(tmp_path / "b", nan=True)), "--out",
                         str(tmp_path / "out-b")], capsys)
    assert code == 2 and "NaN or Inf in encoder.weight (1 values)" in err
    assert not (tmp_path / "out-a").exists() and not (tmp_path / "out-b").exists()


def test_ctrl_c_exits_130(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "train", interrupted)
    code, err = run_cli(train_args(tmp_path / "sae"), capsys)
    assert code == 130 and "interrupted" in err
