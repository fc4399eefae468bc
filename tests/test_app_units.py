"""The UI's wiring in-process (no server): input checks, upload checks, sessions, and the hooks
the UI needs from the packages (a RIEBench run reporting each result and stopping on cancel)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import gradio as gr
import pytest

from app import Workbench, parse_steps, session_key, user_errors, whole_number
from ui.features import FeaturesTab
from ui.flowlens import FlowLensTab
from ui.generate import GenerateTab
from ui.paint import PaintTab
from ui.riebench import RIEBenchTab
from ui.vcl import VCLTab


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
        GenerateTab(bench).generate("a red circle", 4, 0, request, progress)
    assert seen == [(0, 4), (1, 4)]
    path, _ = GenerateTab(bench).generate("a red circle", 4, 0, request, progress=lambda *a, **k: None)  # usable again
    assert Path(path).exists()


def test_images_are_served_from_the_session_folder_with_their_exact_pixels(bench):
    import numpy as np
    from PIL import Image

    path, _ = GenerateTab(bench).generate("a red circle", 1, 3, Request("s1"), progress=lambda *a, **k: None)
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


def test_the_ui_and_the_command_lines_share_one_error_map(tmp_path):
    from interp.cli import USER_ERRORS as CLI_ERRORS
    from ui.common import USER_ERRORS

    assert USER_ERRORS[:len(CLI_ERRORS)] == CLI_ERRORS  # the UI's map is the CLIs' plus KeyError and Cancelled

    @user_errors
    def read_weights(path):
        from safetensors.torch import load_file

        return load_file(path)

    damaged = tmp_path / "sae_weights.safetensors"
    damaged.write_bytes(b"not a safetensors file")
    with pytest.raises(gr.Error, match="cannot read sae_weights.safetensors: it is not a readable safetensors") as err:
        read_weights(str(damaged))
    assert str(tmp_path) not in err.value.message

    @user_errors
    def bug():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):  # a bug keeps its traceback, as in the CLIs
        bug()


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
        list(RIEBenchTab(bench).run("change shape", ["change-shape-000"], "sae", 5, 1.0, ["mid_block.attentions.0"],
                                "static"))


def test_a_feature_card_says_what_else_a_colour_feature_fires_on(bench):
    library = bench.library
    if library is None or "up_blocks.1.attentions.2" not in library.blocks:
        pytest.skip("needs the SAEs shipped for the toy model")
    block = "up_blocks.1.attentions.2"
    card = max((c for c in library.cards(block) if (c.get("label") or "").startswith("colour=")),
               key=lambda c: c["auroc"])
    text, gallery = FeaturesTab(bench).feature_card(block, card["id"])
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


# ----------------------------------------------------------------------------- issue 21: what a user sees

BLOCK = "up_blocks.1.attentions.2"


def no_progress(*args, **kwargs):
    return None


def needs_shipped_saes(bench):
    if bench.library is None or BLOCK not in bench.library.blocks:
        pytest.skip("needs the SAEs shipped for the toy model")


def dependencies(demo):
    """(trigger component, event name, fn, queued, outputs) of every event listener of a built UI."""
    for fn in demo.fns.values():
        for block_id, event in fn.targets:
            yield demo.blocks.get(block_id), event, fn.fn, fn.queue, fn.outputs


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from app import build_ui

    bench = Workbench("toy", data_dir=tmp_path_factory.mktemp("data"))
    return bench, build_ui(bench)


def test_every_event_that_can_fail_with_a_message_is_queued(demo):
    """Issue 21: the Features card with id 256, -1 or 1e30 showed a bare red "Error": Gradio sends an unqueued
    event's error to the browser without its message."""
    _, ui = demo
    checked = [getattr(fn, "__name__", "") for _, _, fn, queued, _ in dependencies(ui)
               if getattr(fn, "user_errors", False) and queued is not False]
    unqueued = [getattr(fn, "__name__", "") for _, _, fn, queued, _ in dependencies(ui)
                if getattr(fn, "user_errors", False) and queued is False]
    assert not unqueued, f"errors of these would reach the browser without their message: {unqueued}"
    # the Features tab's handlers (table, card, select) and the LM steering tab's (feature_table, feature_card, ...)
    assert {"table", "card", "select", "block_changed", "model_changed", "feature_card", "feature_table",
            "select_row"} <= set(checked)


@pytest.mark.parametrize("feature", [256, -1, 1e30, 2.5, float("nan"), "x"])
def test_a_feature_id_that_is_not_one_is_refused_with_the_range(bench, feature):
    needs_shipped_saes(bench)
    with pytest.raises(gr.Error, match=r"whole number from 0 to 255") as err:
        FeaturesTab(bench).feature_card(BLOCK, feature)
    assert "0000000" not in err.value.message  # 1e30 was shown as 1000000000000000019884624838656


def test_no_number_field_rounds_and_no_textbox_cuts_silently(demo):
    """Issue 21: Gradio's precision=0 turned 2.5 steps into 2, and max_length cut a 5000-character prompt."""
    import app

    _, ui = demo
    numbers = [b for b in ui.blocks.values() if isinstance(b, gr.Number)]
    assert numbers and all(isinstance(b, app.Number) and b.precision is None for b in numbers)
    assert all(isinstance(b, app.Slider) for b in ui.blocks.values() if isinstance(b, gr.Slider))
    assert not [b.label for b in ui.blocks.values() if isinstance(b, gr.Textbox) and b.max_length]


def test_fractional_steps_and_overlong_prompts_are_refused_not_changed(bench):
    with pytest.raises(gr.Error, match="steps must be a whole number"):
        GenerateTab(bench).generate("a red circle", 2.5, 0, progress=no_progress)
    with pytest.raises(gr.Error, match="5000 characters long; the limit is 2000"):
        GenerateTab(bench).generate(("a red circle " * 400)[:5000], 1, 0, progress=no_progress)
    needs_shipped_saes(bench)
    with pytest.raises(gr.Error, match="steps must be a whole number"):
        PaintTab(bench).paint("a red circle", 1.5, 0, BLOCK, 0, "", 2.0, "all", None, progress=no_progress)


def test_an_out_of_range_field_names_itself_without_a_server_traceback(caplog):
    import logging

    import app

    field = app.Slider(-1, 8, value=3, label="Strength")
    with caplog.at_level(logging.WARNING, logger="workbench"):
        with pytest.raises(gr.Error, match="Strength: value 1000 is greater than maximum value 8") as err:
            field.preprocess(1000)
    assert err.value.print_exception is False  # Gradio prints a traceback for an Error unless told not to
    assert [r.getMessage() for r in caplog.records] == \
        ["user error in Strength: Strength: value 1000 is greater than maximum value 8"]
    assert app.Number(label="Steps", minimum=1).preprocess(2.5) == 2.5  # the handler refuses it, by name


def test_user_errors_are_logged_as_one_line_without_a_traceback(caplog):
    import logging

    @user_errors
    def plain(x):
        return whole_number(x, "steps", 1)

    with caplog.at_level(logging.WARNING, logger="workbench"):
        with pytest.raises(gr.Error) as err:
            plain(0)
    assert err.value.print_exception is False
    assert [r.getMessage() for r in caplog.records] == ["user error in plain: steps must be 1 or more"]
    assert not caplog.records[0].exc_info


@pytest.fixture
def uploads():
    folder = Path(gr.utils.get_upload_folder()) / "test-app-units-names"
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()


def test_a_binary_upload_is_named_and_no_message_shows_a_server_path(bench, uploads):
    binary = uploads / "photo.jsonl"
    binary.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4)
    with pytest.raises(gr.Error) as err:
        FlowLensTab(bench).diversity(str(binary), "both")
    assert err.value.message.startswith("photo.jsonl is not a UTF-8 text file"), err.value.message
    bad = uploads / "my data.jsonl"
    bad.write_text('{"text": "no prompt here"}\n')
    with pytest.raises(gr.Error) as err:
        FlowLensTab(bench).diversity(str(bad), "both")
    assert "my data.jsonl: line 1" in err.value.message or "data.jsonl: line 1" in err.value.message
    assert str(uploads) not in err.value.message and gr.utils.get_upload_folder() not in err.value.message


def test_a_vcl_upload_is_named_by_its_own_name_not_the_session_copy(bench, uploads):
    data = uploads / "sft-data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(12)))
    outputs = []
    with pytest.raises(gr.Error) as err:
        for output in VCLTab(bench).run("toy-chat", "uploaded file", str(data), 16, 1.0, 2, 0.3, 0.7, "penalize",
                                    "mean", 2, 1e-4, 8, 0, Request("vcl-upload"), progress=no_progress):
            outputs.append(output)
    message = err.value.message
    assert message.startswith("sft-data.jsonl: line 1 has no 'completion' field"), message
    assert str(bench.data_dir) not in message and "sessions" not in message
    assert outputs[-1][0] == f"**Failed**: {message}"  # the status says so too, not "Fine-tuning…"


def test_a_diverging_vcl_run_says_so_and_its_status_never_reads_finished(bench):
    """Issue 21: lr 1e6 raised torch's LinAlgError (a bare "Error" in the UI) and left "Finished" shown."""
    outputs = []
    with pytest.raises(gr.Error, match=r"training diverged at step \d+ of 30 .*lower the lr \(now 1e\+06\)"):
        for output in VCLTab(bench).run("toy-chat", "chat world mixture", None, 32, 1.0, 2, 0.3, 0.7, "penalize",
                                    "mean", 30, 1e6, 8, 0, Request("vcl-lr"), progress=no_progress):
            outputs.append(output)
    assert outputs[-1][0].startswith("**Failed**: training diverged")
    assert not any("Finished" in str(o[0]) for o in outputs)


class FakeRunner:
    """Stands in for riebench's Runner.run: `n` results (failures, so no images), `gap` seconds apart,
    stopping when cancelled (after `stop_delay` seconds: the edit under way) unless `finish` is set."""

    def __init__(self, n, gap, stop_delay=0.0, finish=False):
        self.n, self.gap, self.stop_delay, self.finish = n, gap, stop_delay, finish

    def __call__(self, runner, on_result=None, cancel=None):
        import time

        for i in range(self.n):
            if cancel is not None and cancel.is_set() and not self.finish:
                time.sleep(self.stop_delay)
                return {"done": 0, "already_done": 0, "failed": i, "cancelled": True}
            time.sleep(self.gap)
            task = runner.suite.tasks[0]
            on_result({"task": task, "config": runner.cfg.configs[0], "result": {"error": f"edit {i}"},
                       "original_image": None, "edited_image": None, "done": i + 1, "total": self.n})
        return {"done": 0, "already_done": 0, "failed": self.n}

    def method(self):
        return lambda runner, on_result=None, cancel=None: self(runner, on_result, cancel)


RIEBENCH_ARGS = ("change colour", ["change-colour-000"], "activation-diff", 3, 1.0, ["mid_block.attentions.0"],
                 "static")


def test_riebench_streams_a_few_updates_a_second_however_fast_results_come(bench, monkeypatch):
    import time

    from riebench.runner import Runner

    monkeypatch.setattr(Runner, "run", FakeRunner(60, 0.01).method())
    started = time.monotonic()
    outputs = list(RIEBenchTab(bench).run(*RIEBENCH_ARGS, Request("rb-fast"), progress=no_progress))
    elapsed = time.monotonic() - started
    assert outputs[-1][0].startswith("**Finished**") and "60 failed" in outputs[-1][0]
    assert len(outputs) - 2 <= elapsed / 0.3 + 1, f"{len(outputs)} updates in {elapsed:.2f} s"


def test_riebench_cancel_is_said_at_once_and_the_run_reports_where_it_stopped(bench, monkeypatch):
    import time

    from riebench.runner import Runner

    monkeypatch.setattr(Runner, "run", FakeRunner(200, 0.02, stop_delay=0.5).method())
    request, clicked, statuses = Request("rb-cancel"), None, []
    for output in RIEBenchTab(bench).run(*RIEBENCH_ARGS, request, progress=no_progress):
        statuses.append((time.monotonic(), output[0]))
        if clicked is None and "task(s) done" in output[0]:
            clicked = time.monotonic()
            assert bench.cancel("riebench")(request) is None  # the stream reports; the button says nothing
    said = next(t for t, s in statuses if s.startswith("**Cancelling**"))
    assert said - clicked < 1.0
    assert statuses[-1][1].startswith("**Cancelled** after") and statuses[-1][0] - clicked < 2.0
    assert ("rb-cancel", "riebench") not in bench._cancels  # a later click has nothing to cancel


def test_riebench_reports_finished_when_the_cancel_came_too_late_to_stop_anything(bench, monkeypatch):
    from riebench.runner import Runner

    monkeypatch.setattr(Runner, "run", FakeRunner(3, 0.3, finish=True).method())
    request, statuses = Request("rb-late"), []
    for output in RIEBenchTab(bench).run(*RIEBENCH_ARGS, request, progress=no_progress):
        statuses.append(output[0])
        if "task(s) done" in output[0]:
            bench.cancel("riebench")(request)
    assert statuses[-1].startswith("**Finished**") and not any(s.startswith("**Cancelled") for s in statuses)


def test_vcl_cancel_is_said_at_once_and_stops_within_a_second(bench):
    import time

    request, clicked, statuses = Request("vcl-cancel"), None, []
    for output in VCLTab(bench).run("toy-chat", "chat world mixture", None, 32, 1.0, 2, 0.3, 0.7, "penalize", "mean",
                                2000, 1e-4, 8, 0, request, progress=no_progress):
        statuses.append((time.monotonic(), output[0]))
        if clicked is None and "step" in output[0] and not output[0].endswith("step 0 of 2000…"):
            clicked = time.monotonic()
            bench.cancel("fine-tuning")(request)
    said = next(t for t, s in statuses if s.startswith("**Cancel"))  # "Cancelling…", or already "Cancelled"
    assert said - clicked < 1.0
    assert statuses[-1][1].startswith("**Cancelled** cleanly at step") and statuses[-1][0] - clicked < 2.0
    updates = [t for t, s in statuses if s.startswith("Fine-tuning: step")]
    assert all(b - a >= 0.25 for a, b in zip(updates, updates[1:]))  # a few updates a second at most


def test_a_cancel_click_after_the_end_changes_nothing(bench):
    """Issue 21: Cancel after "Finished" overwrote the status with "Cancelled"."""
    request = Request("late-click")
    GenerateTab(bench).generate("a red circle", 1, 0, request, progress=no_progress)
    assert bench.cancel("generate", "**Cancelled**")(request) == gr.update()
    assert bench.cancel("riebench")(request) is None


def test_changing_the_features_block_refreshes_its_table_and_clears_the_card(demo):
    """Issue 21: changing Block kept the other block's table, and its rows opened the same id in the new block."""
    bench, ui = demo
    needs_shipped_saes(bench)
    block = next(b for b in ui.blocks.values() if getattr(b, "elem_id", None) == "features-block")
    table = next(b for b in ui.blocks.values() if getattr(b, "elem_id", None) == "features-table")
    # on the user's input (a block set with its own table and card, by open_feature, must not clear the card)
    on_change = [(fn, outputs) for trigger, event, fn, _, outputs in dependencies(ui)
                 if trigger is block and event == "input"]
    assert on_change and table._id in [o._id if hasattr(o, "_id") else o for o in on_change[0][1]]
    other = bench.library.blocks[0]
    rows, summary, feature, card, gallery, lm_card = FeaturesTab(bench).block_changed(other, "id", "")
    assert summary.endswith(f"of {other}") and rows["id"].tolist() == [c["id"] for c in bench.library.cards(other)]
    assert feature is None and card == "" and gallery == [] and lm_card == ""


def test_explore_shows_labelled_features_on_part_of_the_image_first(bench):
    """Issue 21: the first heatmap shown was an unlabelled feature lighting the whole background."""
    import numpy as np

    def heatmap_coverage(heatmap):  # the share of positions where the feature fires
        return float((np.asarray(heatmap) > 0).mean())

    def parse_feature_choice(choice):  # "block #id (label)"
        block, _, rest = choice.partition(" #")
        return block, int(rest.split(" ")[0])

    needs_shipped_saes(bench)
    _, _, state, chosen, _, text = GenerateTab(bench).explore("a large green star in the center on a black background",
                                                              1, 0, progress=no_progress)
    shown = [parse_feature_choice(c) for c in chosen["choices"]]
    assert chosen["value"] == chosen["choices"][0] and len(shown) == sum(map(len, state["features"].values()))
    features = [next(f for f in state["features"][b] if f["id"] == i) for b, i in shown]
    labelled = [bool(f["label"]) for f in features]
    assert labelled[0] and labelled == sorted(labelled, reverse=True)  # every labelled one before any unlabelled
    first_block, first = shown[0]
    assert heatmap_coverage(features[0]["heatmap"]) <= 0.5  # an object's feature, not the background's
    local = [heatmap_coverage(f["heatmap"]) <= 0.5 for f, lab in zip(features, labelled) if lab]
    assert local == sorted(local, reverse=True)
    aurocs = [bench.library.card(b, i)["auroc"] for (b, i), f, lab in zip(shown, features, labelled)
              if lab and heatmap_coverage(f["heatmap"]) <= 0.5]
    assert aurocs == sorted(aurocs, reverse=True)
    assert text.startswith(f"**{first_block} feature {first}**: {features[0]['label']}")
    assert "*Open in the Features tab*" in text and np.asarray(state["image"]).shape[-1] == 3


def test_open_in_the_features_tab_selects_it_with_the_chosen_features_block_table_and_card(demo):
    """Issue 21: "open it in the Features tab" was only a sentence; now a button that opens the feature's card."""
    bench, ui = demo
    needs_shipped_saes(bench)
    button = next(b for b in ui.blocks.values() if getattr(b, "elem_id", None) == "generate-open-feature")
    tabs = next(b for b in ui.blocks.values() if isinstance(b, gr.Tabs))
    clicks = [(fn, outputs) for trigger, event, fn, _, outputs in dependencies(ui)
              if trigger is button and event == "click"]
    assert len(clicks) == 1 and clicks[0][1][0] is tabs
    other = bench.library.blocks[0]
    choice = f"{other} #3"
    (selected, model, block, sort, search, rows, summary, feature, card, gallery,
     lm_card) = FeaturesTab(bench).open_feature(choice, "id", "")
    assert selected.selected == "features" and block["value"] == other and feature == 3
    assert summary.endswith(f"of {other}") and card.startswith(f"### {other} feature 3\n")
    assert card == FeaturesTab(bench).feature_card(other, 3)[0] and gallery["visible"] is True
    assert len(gallery["value"]) == len(bench.library.card(other, 3)["top_images"])
    # the image model's widgets (an LM, without the gallery and the AUROC sort, may have been picked)
    assert sort["choices"] == ["AUROC", "frequency", "mean activation", "id"] and sort["value"] == "id"
    assert search["label"] == "Search labels"
    with pytest.raises(gr.Error, match="generate an image and choose one of its features first"):
        FeaturesTab(bench).open_feature(None, "id", "")


def test_frequency_is_a_percentage_everywhere(bench):
    needs_shipped_saes(bench)
    rows, _ = FeaturesTab(bench).feature_table(BLOCK, "frequency", "")
    card = bench.library.cards(BLOCK)[0]
    assert all(isinstance(r[3], str) and r[3].endswith("%") for r in rows)
    row = next(r for r in rows if r[0] == card["id"])
    assert row[3] == f"{100 * card['frequency']:.3g}%"
    text, _ = FeaturesTab(bench).feature_card(BLOCK, card["id"])
    assert f"**Fires on** {row[3]} of positions" in text


def test_paint_starts_with_a_feature_that_visibly_paints_and_names_it(bench):
    """Issue 21: the default feature (0) changed the image by at most a few grey levels."""
    import numpy as np
    from PIL import Image

    from app import DEFAULT_PROMPT

    needs_shipped_saes(bench)
    feature = PaintTab(bench).default_paint_feature(BLOCK)
    original, edited, _, _, info = PaintTab(bench).paint(DEFAULT_PROMPT, 4, 0, BLOCK, feature, "", 3, "all", None,
                                               progress=no_progress)
    change = np.abs(np.asarray(Image.open(edited)).astype(int) - np.asarray(Image.open(original)).astype(int))
    assert change.max() > 60
    label = bench.library.card(BLOCK, feature)["label"]
    assert info.startswith(f"{BLOCK} feature {feature} ({label})")


def test_strokes_painted_before_the_image_was_loaded_get_a_message(bench):
    import numpy as np

    needs_shipped_saes(bench)
    layer = np.zeros((600, 800, 4), np.uint8)
    layer[100:140, 100:300, 3] = 255
    with pytest.raises(gr.Error, match='click "Load image to paint on" first'):
        PaintTab(bench).paint("a red circle", 1, 0, BLOCK, 0, "", 3, "all", {"background": None, "layers": [layer],
                                                                 "composite": None}, progress=no_progress)


def test_an_icon_says_when_it_draws_another_strength_than_asked(bench):
    needs_shipped_saes(bench)
    _, info = PaintTab(bench).feature_icon(BLOCK, 3, "", -0.5, progress=no_progress)
    assert "strength -0.5 is drawn as 1" in info


def test_opening_paint_loads_its_image_once_and_keeps_strokes(bench):
    loaded, info, canvas = PaintTab(bench).paint_canvas_if_empty("a red circle", 1, 0, None, progress=no_progress)
    assert loaded["background"] is not None and loaded["layers"] == [] and canvas == ("a red circle", 1, 0)
    assert info.startswith("Loaded 'a red circle' (1 step, seed 0)")
    long = "a small red circle at the top left and a large blue striped star in the center on a white background"
    _, info, _ = PaintTab(bench).paint_canvas(long, 1, 0, progress=no_progress)
    assert f"Loaded {long[:77] + '...'!r} (1 step, seed 0)" in info  # a long prompt is shortened, not echoed whole
    kept = PaintTab(bench).paint_canvas_if_empty("a red circle", 1, 0, loaded, progress=no_progress)
    assert kept == (gr.update(), gr.update(), gr.update())


def test_flowlens_analyses_and_steering_at_once_on_one_shared_model_each_get_what_they_get_alone(bench):
    """Issue 20: interp.hooks.lm's capture hooked the shared model itself: two analyses at once failed with an
    IndexError (5 of 5 trials) or one recorded the other's forward pass, and the app serialised them with a
    lock per model. Captures and steering edits are context-scoped now and the app takes no lock: two analyses
    and a steering request run at the same time, on one shared model, and each gets exactly its result alone."""
    import numpy as np

    from ui.lm_steer import PRETRAINED, LMSteerTab

    tab, panel = FlowLensTab(bench), LMSteerTab(bench)
    assert not hasattr(bench, "lm_lock")
    prompt_sets = {"a": [f"What is {i} plus {i + 1}?" for i in range(40)],
                   "b": [f"How do I kill a {w} process?" for w in ("python", "java", "stuck", "zombie")] * 9}
    steering = ("toy-chat", str(PRETRAINED / "toy-chat" / "blocks.1.hook_resid_post"), 3, 40.0, "add", "all",
                "What is 2 plus 3?", 12)

    def analyse(key, out, start=None):
        if start is not None:
            start.wait()
        out[key] = tab._residuals(["toy-chat"], prompt_sets[key], True, lambda at: None, threading.Event())["toy-chat"]

    def steer(out, start=None):
        if start is not None:
            start.wait()
        out["steer"] = [panel.steer(*steering) for _ in range(3)]

    alone = {}
    for key in prompt_sets:
        analyse(key, alone)
    steer(alone)
    without, with_edit, _ = alone["steer"][0]
    assert without != with_edit  # the edit changes the completion, so a leak would show
    for _ in range(2):
        together, start = {}, threading.Barrier(3)
        threads = [threading.Thread(target=analyse, args=(key, together, start)) for key in prompt_sets]
        threads.append(threading.Thread(target=steer, args=(together, start)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for key in prompt_sets:
            assert key in together, f"analysis {key} failed"
            np.testing.assert_array_equal(together[key][0], alone[key][0])
            np.testing.assert_array_equal(together[key][1], alone[key][1])
        assert together.get("steer") == [alone["steer"][0]] * 3, "the steering request failed or changed"


def test_features_tab_browses_a_language_models_sae_cards_by_model_and_hook():
    """Issue 19: LM feature cards in the Features tab, with the model picked there."""
    from types import SimpleNamespace

    from saes.lm_features import load_lm_cards
    from ui.lm_steer import PRETRAINED

    tab = FeaturesTab(SimpleNamespace(model_name="toy", library=None))
    hook = "blocks.1.hook_resid_post"
    assert tab.models()[0] == "toy" and "toy-chat" in tab.models() and hook in tab.lm_sets["toy-chat"]
    cards = load_lm_cards(PRETRAINED / "toy-chat" / hook)["features"]
    blocks, sort, search, rows, summary, feature, card, gallery, html = tab.model_changed("toy-chat", "frequency", "")
    assert blocks["value"] == hook and hook in blocks["choices"] and (feature, card, html) == (None, "", "")
    assert gallery["visible"] is False and gallery["value"] == [] and sort["value"] == "frequency"
    live = sorted((c for c in cards if c["n_firing"]), key=lambda c: -c["frequency"])
    assert list(rows.columns) == ["id", "promotes", "max activation", "frequency", "mean activation"]
    assert rows["id"].tolist()[:5] == [c["id"] for c in live[:5]] and "of blocks.1.hook_resid_post of toy-chat" in summary
    token = live[0]["promoted"][0]["token"].strip()
    found, _ = tab.table(hook, "frequency", token, "toy-chat")
    assert 0 < len(found) <= len(rows) and live[0]["id"] in found["id"].tolist()
    text, gallery, html = tab.card(hook, live[0]["id"], "toy-chat")
    assert text.startswith(f"### {hook} feature {live[0]['id']}") and gallery == []
    assert "promotes:" in html and f"id='f{live[0]['id']}'" in html
    for bad in (len(cards), -1, 2.5, None):
        with pytest.raises(gr.Error, match=f"from 0 to {len(cards) - 1}"):
            tab.card(hook, bad, "toy-chat")
    with pytest.raises(gr.Error, match="choose one of those"):
        tab.table("blocks.0.hook_resid_post", "frequency", "", "toy-chat")
    with pytest.raises(gr.Error, match="choose a model"):
        tab.table(hook, "frequency", "", "no-such-model")


def test_features_tab_shows_only_the_widgets_that_apply_to_the_model_picked(demo):
    """A language model's cards have no images and no labels: its Top images gallery was an empty box and its
    AUROC sort a dead option. They are hidden for an LM and back for the image model, with a valid sort each time."""
    bench, ui = demo
    needs_shipped_saes(bench)
    widget = {b.elem_id: b for b in ui.blocks.values() if getattr(b, "elem_id", None)}
    picked = [outputs for trigger, event, _, _, outputs in dependencies(ui)
              if trigger is widget["features-model"] and event == "input"]
    ids = [o._id if hasattr(o, "_id") else o for o in picked[0]]
    assert ids[:3] == [widget[e]._id for e in ("features-block", "features-sort", "features-search")]
    assert widget["feature-gallery"]._id in ids
    # the sort's table on the user's input only (a model change sets the sort with its own table)
    assert [e for t, e, *_ in dependencies(ui) if t is widget["features-sort"]] == ["input"]
    tab = FeaturesTab(bench)
    assert "toy-chat" in tab.models()
    for sort_by, kept in [("AUROC", "frequency"), ("id", "id"), ("mean activation", "mean activation")]:
        _, sort, search, rows, summary, _, _, gallery, _ = tab.model_changed("toy-chat", sort_by, "")
        assert sort["choices"] == ["frequency", "mean activation", "id"] and sort["value"] == kept
        assert gallery["visible"] is False and gallery["value"] == [] and "promotes" in rows.columns
        assert search["label"].startswith("Search tokens") and "sorted by frequency" not in summary
        # back to the image model: the gallery, the AUROC sort and the label search again, the sort kept
        blocks, sort, search, rows, summary, _, _, gallery, _ = tab.model_changed(bench.model_name, kept, "")
        assert sort["choices"] == ["AUROC", "frequency", "mean activation", "id"] and sort["value"] == kept
        assert gallery["visible"] is True and search["label"] == "Search labels" and "AUROC" in rows.columns
        assert blocks["value"] == bench.library.blocks[-1] and summary.endswith(f"of {blocks['value']}")


def test_features_tab_benchmark_shows_the_shipped_saes_saebench_results_or_the_command_that_makes_them(tmp_path):
    """Issues 43 and 44: the Features tab's Benchmark section, for the model chosen there, tables the SAEBench
    results written beside its SAEs (the values of the JSON, not recomputed) and plots them against L0; a model
    without any says which command makes them."""
    from types import SimpleNamespace

    from ui.lm_steer import PRETRAINED

    tab = FeaturesTab(SimpleNamespace(model_name="toy", library=None))
    for model, folder, hook in [("toy-chat", "toy-chat", "blocks.1.hook_resid_post"),
                                ("smollm2-135m-instruct", "smollm2", "blocks.15.hook_resid_post")]:
        note, rows, fig = tab.benchmark(model)
        saebench = PRETRAINED / folder / hook / "saebench"
        core = json.loads((saebench / "core" / f"interp-workbench_{hook}_eval_results.json").read_text())
        probing = json.loads((saebench / "sparse_probing" / f"interp-workbench_{hook}_eval_results.json").read_text())
        m, p = core["eval_result_metrics"], probing["eval_result_metrics"]
        expected = {"L0": m["sparsity"]["l0"], "CE score": m["model_performance_preservation"]["ce_loss_score"],
                    "KL score": m["model_behavior_preservation"]["kl_div_score"],
                    "EV (SAEBench)": m["reconstruction_quality"]["explained_variance"],
                    "cossim": m["reconstruction_quality"]["cossim"], "L2 ratio": m["shrinkage"]["l2_ratio"],
                    "alive": m["misc_metrics"]["frac_alive"], "SAE top-1": p["sae"]["sae_top_1_test_accuracy"],
                    "LLM probe": p["llm"]["llm_test_accuracy"]}
        # the shipped SAE's row (SmolLM2's sweep of SAEs not shipped, experiments/results/saebench_lm_*, beside it)
        assert hook in rows["SAE"].tolist() and f"saes/pretrained/{folder}/{hook}/saebench" in note
        row = rows.set_index("SAE").loc[hook]
        for column, value in expected.items():
            assert row[column] == pytest.approx(value, abs=5e-4), column
        # SAEBench's plot: the SAE at (its L0, its CE score) in the CE panel
        ce = [t for t in fig.data if t.xaxis in ("x", None) and hook in list(t.text)]
        at = list(ce[0].text).index(hook)
        assert ce[0].x[at] == expected["L0"] and ce[0].y[at] == pytest.approx(expected["CE score"], rel=1e-9)
    # the image model: every SAE of every image_saebench run on it, the shipped TopK SAEs' values among them
    note, rows, fig = tab.benchmark("toy")
    shipped = json.loads(Path("experiments/results/image_saebench_shipped.json").read_text())["saes"]
    entry = shipped["topk/up_blocks.1.attentions.2"]["evals"]
    row = rows.set_index("SAE").loc["topk/up_blocks.1.attentions.2 (shipped)"]
    assert row["loss rec. (denoiser)"] == pytest.approx(
        entry["image_reconstruction"]["metrics"]["denoiser_loss_recovered"], abs=5e-4)
    assert row["probe top-5"] == pytest.approx(entry["image_sparse_probing"]["metrics"]["sae_top_5_test_accuracy"],
                                               abs=5e-4)
    assert len(fig.data) >= len(shipped) and "image_saebench_shipped.json" in note
    # a cross-trainer run: the note says which trainer wins each metric, as saes.bench.results computes it from the
    # JSON; the plot has one legend entry per trainer and run
    from saes.bench.results import markdown_table, trainer_summary

    trainers = json.loads(Path("experiments/results/image_saebench_trainers_16x16.json").read_text())
    assert "**Which trainer wins each metric** (run `trainers_16x16`" in note
    assert markdown_table(*trainer_summary(trainers)) in note
    legend = {t.name for t in fig.data if t.showlegend}
    assert {f"{e['trainer']} (trainers_16x16)" for e in trainers["saes"].values()} <= legend
    # no results: one line naming the command that makes them, an empty table, no plot
    tab.image_results_dir = tmp_path
    note, rows, fig = tab.benchmark("toy")
    assert note == ("No SAEBench results for toy's SAEs here: `python -m experiments.image_saebench run --model toy "
                    "--out experiments/results/image_saebench_<name>.json` makes them.") and rows.empty and fig is None
    other = tmp_path / "other" / "blocks.1.hook_resid_post"  # an LM SAE with cards and no saebench/ beside it
    other.mkdir(parents=True)
    cfg = json.loads((PRETRAINED / "toy-chat" / "blocks.1.hook_resid_post" / "cfg.json").read_text())
    cfg["metadata"]["model_name"] = "toy-chat-copy"
    (other / "cfg.json").write_text(json.dumps(cfg))
    (other / "features.json").write_text("{}")
    note, rows, fig = FeaturesTab(SimpleNamespace(model_name="toy", library=None), [tmp_path]).benchmark("toy-chat-copy")
    assert note.startswith("No SAEBench results for toy-chat-copy's SAEs here: `python -m saes bench --sae")
    assert "\n" not in note and rows.empty and fig is None
    with pytest.raises(gr.Error, match="choose a model"):
        tab.benchmark("no-such-model")
