"""VCL fine-tuning (full and LoRA) under torchrun: 2 gloo ranks, each running half of every step's micro-batches,
end with the weights of one process running all of them; a --grad-accum the world size does not divide is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_flowlens_finetune import PAIRS  # noqa: E402  the tiny model's corpus

from flowlens.finetune import FinetuneConfig, finetune  # noqa: E402
from flowlens.tiny import tiny_llama, word_level_tokenizer  # noqa: E402
from flowlens.vcl import VCLConfig  # noqa: E402


def config_for(model_dir, data_file, out, **changes) -> FinetuneConfig:
    settings = dict(model=str(model_dir), data=str(data_file), out=str(out), steps=3, batch_size=4, grad_accum=2,
                    lr=3e-3, max_length=32, save_every=2, progress=False,
                    vcl=VCLConfig(k=2, weight=1.0, window=(0.3, 1.0)))
    settings.update(changes)
    return FinetuneConfig(**settings)


def _worker(model_dir: str, data_file: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    finetune(config_for(model_dir, data_file, Path(out) / "full"))
    finetune(config_for(model_dir, data_file, Path(out) / "lora", lora=True, lora_r=4))
    try:
        finetune(config_for(model_dir, data_file, Path(out) / "odd", grad_accum=3))
    except ValueError as err:
        (Path(out) / f"odd{dist.get_rank()}.txt").write_text(str(err))
    dist.destroy_process_group()


def test_two_rank_finetuning_equals_one_process(tmp_path):
    import json

    torch.set_num_threads(1)
    tokenizer = word_level_tokenizer([p + " " + c for p, c in PAIRS])
    tiny_llama(len(tokenizer), hidden_size=32, layers=4, max_positions=64).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in PAIRS))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           "29581", __file__, str(tmp_path / "model"), str(data), str(tmp_path / "ddp")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, changes in (("full", {}), ("lora", {"lora": True, "lora_r": 4})):
        finetune(config_for(tmp_path / "model", data, tmp_path / "one" / name, **changes))
        ours = load_file(str(tmp_path / "ddp" / name / "model" / ("adapter_model.safetensors" if changes else
                                                                   "model.safetensors")))
        theirs = load_file(str(tmp_path / "one" / name / "model" / ("adapter_model.safetensors" if changes else
                                                                     "model.safetensors")))
        assert ours.keys() == theirs.keys() and ours
        for key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=f"{name} {key}")
        log = lambda d: [json.loads(line) for line in (d / name / "log.jsonl").read_text().splitlines()]  # noqa: E731
        for a, b in zip(log(tmp_path / "ddp"), log(tmp_path / "one"), strict=True):
            assert abs(a["loss"] - b["loss"]) < 1e-5 and abs(a["vcl_loss"] - b["vcl_loss"]) < 1e-5
    for rank in (0, 1):
        assert (tmp_path / "ddp" / f"odd{rank}.txt").read_text() == (
            "under torchrun the 3 micro-batches of a step (--grad-accum) are split over 2 processes: choose a "
            "--grad-accum that is a multiple of 2")
    assert not (tmp_path / "ddp" / "odd").exists()


if __name__ == "__main__":
    _worker(*sys.argv[1:4])
