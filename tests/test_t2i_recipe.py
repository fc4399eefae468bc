import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(out: Path, unet_steps: int):
    return subprocess.run(
        [sys.executable, "-m", "interp.zoo", "train", "t2i", "--out", str(out), "--scenes", "64", "--vae-steps", "2",
         "--unet-steps", str(unet_steps), "--batch", "4", "--checkpoint-every", "2", "--probe-every", "0",
         "--threads", "1"], capture_output=True, text=True, cwd=ROOT)


def test_recipe_trains_saves_a_loadable_pipeline_and_resumes(tmp_path):
    first = train(tmp_path, unet_steps=2)
    assert first.returncode == 0, first.stderr[-2000:]
    second = train(tmp_path, unet_steps=4)  # as after an interruption at step 2: picks up there
    assert second.returncode == 0, second.stderr[-2000:]
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert {"stage": "unet", "resumed_at": 2}.items() <= next(r for r in log if "resumed_at" in r
                                                               and r["stage"] == "unet").items()
    from interp.models import load_t2i

    model = load_t2i(str(tmp_path / "pipeline"), device="cpu")
    assert model.vocabulary and "circle" in model.vocabulary
    assert model.generate("a red circle", seed=0)[0].size == (64, 64)
