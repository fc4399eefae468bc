import argparse
import json

from interp.zoo import t2i_recipe


def train(out, unet_steps: int):
    parser = argparse.ArgumentParser()
    t2i_recipe.add_arguments(parser)
    args = parser.parse_args(["--out", str(out), "--scenes", "32", "--vae-steps", "2", "--unet-steps", str(unet_steps),
                              "--batch", "4", "--checkpoint-every", "2", "--probe-every", "0", "--threads", "1"])
    t2i_recipe.main(args)


def test_recipe_trains_saves_a_loadable_pipeline_and_resumes(tmp_path):
    train(tmp_path, unet_steps=2)
    train(tmp_path, unet_steps=4)  # as after an interruption at step 2: picks up there, no step lost
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    resumed = [r for r in log if "resumed_at" in r]
    assert {(r["stage"], r["resumed_at"]) for r in resumed} == {("vae", 2), ("unet", 2)}
    from interp.models import load_t2i

    model = load_t2i(str(tmp_path / "pipeline"), device="cpu")
    assert model.vocabulary and "circle" in model.vocabulary
    assert model.generate("a red circle", seed=0)[0].size == (64, 64)
