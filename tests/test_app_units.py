"""The UI's wiring in-process (no server): input checks, upload checks, sessions, and the hooks
the UI needs from the packages (a RIEBench run reporting each result and stopping on cancel)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import gradio as gr
import pytest

from app import Workbench, parse_steps, session_key, user_errors, whole_number


class Request:
    def __init__(self, session_hash):
        self.session_hash = session_hash


@pytest.fixture
def bench(tmp_path):
    return Workbench("toy", data_dir=tmp_path / "data")


def test_session_folders_are_named_by_a_sanitised_session_hash_and_removed_at_the_end(bench, tmp_path):
    assert session_key(Request("../../etc/passwd")) == "etcpasswd"
    assert session_key(None) == "anonymous"
    folder = bench.session_dir(Request("../../x"), "riebench")
    assert folder.resolve().is_relative_to((tmp_path / "data" / "sessions").resolve())
    event = bench.start_action(Request("../../x"), "riebench")
    bench.end_session(Request("../../x"))
    assert event.is_set() and not folder.exists()


def test_cancel_sets_only_the_clicking_sessions_event(bench):
    mine, theirs = bench.start_action(Request("a"), "fine-tuning"), bench.start_action(Request("b"), "fine-tuning")
    assert bench.cancel("fine-tuning", "stopping")(Request("a")) == "stopping"
    assert mine.is_set() and not theirs.is_set()


def test_cancel_stops_a_generation_between_two_steps_with_a_message(bench):
    request, seen = Request("a"), []

    def progress(value, desc=None, unit=None):
        seen.append(value)
        if value[0] == 1:
            bench.cancel("generate")(request)  # the Cancel button, clicked during step 2

    with pytest.raises(gr.Error, match="cancelled"):
        bench.generate("a red circle", 4, 0, request, progress)
    assert seen == [(0, 4), (1, 4)]
    path, _ = bench.generate("a red circle", 4, 0, request, progress=lambda *a, **k: None)  # usable again
    assert Path(path).exists()


def test_images_are_served_from_the_session_folder_with_their_exact_pixels(bench):
    import numpy as np
    from PIL import Image

    path, _ = bench.generate("a red circle", 1, 3, Request("s1"), progress=lambda *a, **k: None)
    assert Path(path).resolve().is_relative_to((bench.data_dir / "sessions" / "s1").resolve())
    direct = bench.t2i.generate("a red circle", steps=1, seed=3)[0]
    assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), np.asarray(direct))
    assert not list(Path(path).parent.glob(".*"))  # no partial file left behind


def test_uploads_outside_the_upload_folder_or_of_the_wrong_type_or_size_are_refused(bench, tmp_path):
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"prompt": "a"}\n')
    with pytest.raises(ValueError, match="only files uploaded through this page"):
        bench.checked_upload(str(outside), (".jsonl",))
    uploads = Path(gr.utils.get_upload_folder()) / "test-app-units"
    uploads.mkdir(parents=True, exist_ok=True)
    try:
        wrong = uploads / "data.txt"
        wrong.write_text("x\n")
        with pytest.raises(ValueError, match="takes .jsonl or .csv files only"):
            bench.checked_upload(str(wrong), (".jsonl", ".csv"))
        big = uploads / "big.jsonl"
        big.write_bytes(b"x" * 2_000_001)
        with pytest.raises(ValueError, match="the limit is 2 MB"):
            bench.checked_upload(str(big), (".jsonl",))
        sneaky = uploads / ".." / ".." / outside.relative_to("/")
        with pytest.raises(ValueError, match="only files uploaded"):
            bench.checked_upload(str(sneaky), (".jsonl",))
        good = uploads / "good.jsonl"
        good.write_text('{"prompt": "a"}\n')
        assert bench.checked_upload(str(good), (".jsonl",)) == good.resolve()
    finally:
        for path in uploads.iterdir():
            path.unlink()
        uploads.rmdir()


def test_user_errors_turn_bad_input_into_a_message_for_functions_and_generators():
    @user_errors
    def plain(x):
        return whole_number(x, "steps", 1)

    @user_errors
    def streaming(x):
        yield 1
        yield whole_number(x, "steps", 1)

    assert plain(3) == 3
    with pytest.raises(gr.Error, match="steps must be 1 or more"):
        plain(0)
    with pytest.raises(gr.Error, match="steps must be a whole number"):
        list(streaming(2.5))
    with pytest.raises(gr.Error, match="out of range"):
        user_errors(parse_steps)("0-4", 2)


def test_runner_reports_each_result_and_stops_cleanly_when_cancelled(tmp_path):
    from test_riebench import MID, few_tasks, random_model

    from riebench.methods import MethodConfig
    from riebench.runner import RunConfig, Runner, load_results

    tasks = few_tasks(1, ["change shape", "change colour", "delete object"])
    cancel = threading.Event()
    seen = []

    def on_result(event):
        seen.append(event)
        cancel.set()  # cancel as soon as the first edit is done

    cfg = RunConfig(model="random", configs=[MethodConfig("activation-diff", k_trans=2, blocks=[MID])])
    runner = Runner(cfg, tmp_path, model=random_model(), suite=tasks, progress=False)
    counts = runner.run(on_result=on_result, cancel=cancel)
    assert counts == {"done": 1, "already_done": 0, "failed": 0, "cancelled": True}
    assert len(seen) == 1 and seen[0]["done"] == 1 and seen[0]["total"] == 3
    assert seen[0]["task"].id == tasks.tasks[0].id and seen[0]["edited_image"] is not None
    assert json.loads(json.dumps(seen[0]["result"]["metrics"]))  # the result as written to disk
    done, _ = load_results(tmp_path)
    assert [r["task"] for r in done] == [tasks.tasks[0].id]
    resumed = Runner(cfg, tmp_path, model=random_model(), suite=tasks, progress=False).run()
    assert resumed == {"done": 2, "already_done": 1, "failed": 0}  # a cancelled run resumes where it stopped


def test_the_sae_method_without_saes_says_which_methods_can_run(tmp_path):
    bench = Workbench("/no/such/model", data_dir=tmp_path)  # no SAEs; the model is never loaded
    with pytest.raises(gr.Error, match="needs SAEs.*activation-diff, neurons or prompt-swap"):
        list(bench.riebench_run("change shape", ["change-shape-000"], "sae", 5, 1.0, ["mid_block.attentions.0"],
                                "static"))


def test_a_feature_card_says_what_else_a_colour_feature_fires_on(bench):
    library = bench.library
    if library is None or "up_blocks.1.attentions.2" not in library.blocks:
        pytest.skip("needs the SAEs shipped for the toy model")
    block = "up_blocks.1.attentions.2"
    card = max((c for c in library.cards(block) if (c.get("label") or "").startswith("colour=")),
               key=lambda c: c["auroc"])
    text, gallery = bench.feature_card(block, card["id"])
    assert f"feature {card['id']}" in text and card["label"] in text
    assert "Firing rate by colour" in text and f"{card['value']} " in text.split("Firing rate by colour")[1]
    assert gallery  # its top images with heatmaps


def test_two_requests_of_one_session_each_keep_their_own_image(bench):
    """Issue 21: one file per output slot let a later request of the same session replace an earlier
    request's image before Gradio had copied it."""
    import numpy as np
    from PIL import Image

    session = Request("one-client")
    red, blue = np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.uint8)
    red[..., 0], blue[..., 2] = 255, 255
    first = bench.image_file(session, red, "generated")
    second = bench.image_file(session, blue, "generated")
    assert first != second
    assert np.asarray(Image.open(first))[0, 0].tolist() == [255, 0, 0]
    assert np.asarray(Image.open(second))[0, 0].tolist() == [0, 0, 255]
