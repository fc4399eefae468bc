"""`torchrun --nproc-per-node 2 -m interp collect --model toy-chat --text ...` writes one store equal to the
store of a single process: the same tensors bit for bit, metadata and manifest (rank r writes shards r, r + 2,
...; rank 0 the plan and the manifest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from interp.__main__ import main as interp_main

HOOK = "blocks.2.hook_resid_post"


def test_two_rank_lm_collection_equals_one_process(tmp_path):
    from zoo.chat.world import World

    corpus = tmp_path / "train.jsonl"
    examples = World().mixture("train", 120, {"general": 0.6, "benign": 0.2, "harmful": 0.2}, seed=1)
    corpus.write_text("".join(json.dumps(e) + "\n" for e in examples))
    args = ["collect", "--model", "toy-chat", "--hooks", HOOK, "blocks.0.hook_resid_pre", "--text", str(corpus),
            "--max-tokens", "1500", "--tokens-per-shard", "500", "--batch-size", "7", "--context", "24",
            "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           "29571", "-m", "interp", *args, "--out", str(tmp_path / "two")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert interp_main([*args, "--out", str(tmp_path / "one")]) == 0
    one, two = (sorted(p.relative_to(tmp_path / d) for p in (tmp_path / d).rglob("*") if p.is_file())
                for d in ("one", "two"))
    assert one == two and len([p for p in one if p.parts[0] == "shards"]) == 3
    for path in one:
        a, b = tmp_path / "one" / path, tmp_path / "two" / path
        if path.suffix != ".safetensors":
            assert a.read_bytes() == b.read_bytes(), path  # plan.json, manifest.json (its digests of every shard)
            continue
        # the same tensors bit for bit and the same metadata (whose key order safetensors does not keep)
        with safe_open(a, "pt") as x, safe_open(b, "pt") as y:
            assert x.metadata() == y.metadata() and sorted(x.keys()) == sorted(y.keys())
            for key in x.keys():
                assert torch.equal(x.get_tensor(key), y.get_tensor(key)), (path, key)


def test_a_collective_broken_by_a_dead_rank_is_one_line():
    from interp.cli import user_error_message

    # gloo's own words on the surviving rank when rank 1 of tests/test_saes_distributed.py exits mid-run
    err = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                       "peer [127.0.0.1]:34537. This is typically caused by a remote worker crashing.")
    assert user_error_message(err).startswith("another process of this torchrun job stopped")
    assert user_error_message(RuntimeError("shape mismatch")) is None  # a bug keeps its traceback
