"""Issue 41, the UI and the app's start: what a stranger's request can do to the server, the answers that were
blank or silent, and the start-up checks. Through the handlers and the page's own Blocks, in-process (no server);
the page-only behaviours (Cancel timing, the stale paint mask) are in tests/test_app.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest

from app import Workbench, parse_steps

ROOT = Path(__file__).resolve().parents[1]
BOM = "\ufeff"


class Request:
    def __init__(self, session_hash):
        self.session_hash = session_hash


def no_progress(*args, **kwargs):
    return None


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return Workbench("toy", data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def demo(bench):
    from app import build_ui

    return build_ui(bench)


def endpoint(demo, name: str):
    return next(fn for fn in demo.fns.values() if fn.api_name == name.lstrip("/") and fn.api_visibility == "public")


def preprocess(demo, name: str, data: list):
    """What the page's Blocks makes of a raw request's data for an endpoint (as Gradio's server calls it)."""
    return asyncio.run(demo.preprocess_data(endpoint(demo, name), data, None))


# ----------------------------------------------------------------------------- server resources

def test_a_huge_paint_step_range_is_refused_before_anything_is_built():
    """'0-99999999' built a set of 10^8 steps (42 s, 6 GB) before the error."""
    tracemalloc.start()
    try:
        for text in ("0-99999999", "0-999999999999", "3,0-99999999"):
            with pytest.raises(ValueError, match=r"step \d+ is out of range: this generation has steps 0 to 3"):
                parse_steps(text, 4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # bytes: nothing the size of the range was allocated
    with pytest.raises(ValueError, match="the limit is 1000"):
        parse_steps("0," * 600, 4)
    assert parse_steps("1-2,0", 4) == [0, 1, 2]  # what is in range still parses


def test_lm_strength_is_bounded_and_a_set_at_minus_1e39_is_one_clear_line(bench):
    from interp.edits import EditError
    from interp.hooks.lm_steer import MAX_LM_STRENGTH, LMEdit
    from ui.lm_steer import PRETRAINED, LMSteerTab

    for strength in (1e20, -1e39, MAX_LM_STRENGTH * 1.5):
        with pytest.raises(EditError, match="out of range"):
            LMEdit("blocks.1.hook_resid_post", "set", feature=0, strength=strength)
    LMEdit("blocks.1.hook_resid_post", "set", feature=0, strength=-MAX_LM_STRENGTH)  # the bound itself is allowed
    sae = str(PRETRAINED / "toy-chat" / "blocks.1.hook_resid_post")
    for strength in (-1e39, 1e20):
        with pytest.raises(gr.Error, match="strength must be between -10000 and 10000") as err:
            LMSteerTab(bench).steer("toy-chat", sae, 3, strength, "set", "all", "What is 2 plus 3?", 4)
        assert err.value.message.strip()


def test_an_empty_edited_completion_is_said_in_the_status(bench, monkeypatch):
    import flowlens.steer
    from ui.lm_steer import PRETRAINED, LMSteerTab

    sae = str(PRETRAINED / "toy-chat" / "blocks.1.hook_resid_post")
    monkeypatch.setattr(flowlens.steer, "steer_comparison",
                        lambda *a, **k: {"without": "five.", "with": "", "prompt": "", "edit": {}})
    without, edited, status = LMSteerTab(bench).steer("toy-chat", sae, 3, 9000, "add", "all", "What is 2 plus 3?", 4)
    assert (without, edited) == ("five.", "")
    assert "The edited completion is empty" in status and "strength 9000" in status


def test_lm_steering_shows_progress_and_stops_at_cancel(bench):
    from ui.lm_steer import PRETRAINED, LMSteerTab

    sae = str(PRETRAINED / "toy-chat" / "blocks.1.hook_resid_post")
    request, seen = Request("steerer"), []
    args = ("toy-chat", sae, 3, 40.0, "add", "all", "What is 2 plus 3?", 24)

    def progress(value, desc=None, unit=None):
        seen.append(value)

    LMSteerTab(bench).steer(*args, request=request, progress=progress)
    assert seen and all(total == 48 for _, total in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    seen.clear()

    def cancel_at_third(value, desc=None, unit=None):
        seen.append(value)
        if value[0] == 3:  # the Cancel button, clicked during the first completion
            assert bench.cancel("lm-steer", "**Cancelled**")(request) == "**Cancelled**"

    with pytest.raises(gr.Error, match="cancelled"):
        LMSteerTab(bench).steer(*args, request=request, progress=cancel_at_third)
    assert seen[-1][0] <= 4  # stopped at the next token, not after both completions
    assert bench.cancel("lm-steer", "**Cancelled**")(request) == gr.update()  # nothing runs any more


def test_the_vcl_tabs_live_curves_are_bounded_at_any_length():
    from flowlens.training_log import loss_curves_figure
    from ui.vcl import FIGURE_INTERVAL_S, LIVE_PLOT_POINTS

    entries = [{"step": i + 1, "loss": 1 / (i + 1), "sft_loss": 1.0, "vcl_loss": 0.5} for i in range(2000)]
    live = loss_curves_figure(entries, max_points=LIVE_PLOT_POINTS)
    for trace in live.data:
        assert len(trace.x) <= LIVE_PLOT_POINTS and trace.x[0] == 1 and trace.x[-1] == 2000
        assert trace.mode == "lines"  # no 6,000 markers
    assert [len(t.x) for t in loss_curves_figure(entries).data] == [2000] * 3  # the finished run's: every step
    assert [len(t.x) for t in loss_curves_figure(entries[:50], max_points=LIVE_PLOT_POINTS).data] == [50] * 3
    assert FIGURE_INTERVAL_S >= 2.0


# ----------------------------------------------------------------------------- silent or blank answers

FORGED = [
    ("/generate", [True, 1, 0], "Prompt: expected text, not true/false"),
    ("/generate", [{}, 1, 0], "Prompt: expected text, not an object"),
    ("/generate", ["a red circle", True, 0], "Steps: true is not a number"),
    # the last None: the page's own state (the editor's loaded image), which the server adds to an API call
    ("/paint", ["a red circle", 1, 0, "up_blocks.1.attentions.2", True, "", 2.0, "all", None, None],
     "Feature id: true is not a number"),
    ("/paint", ["a red circle", 1, 0, "up_blocks.1.attentions.2", 3, "", None, "all", True, None],
     "expected an uploaded file"),
    ("/flowlens", [["toy-chat"], "none", "uploaded file", "abc", 24, 3, False], "expected an uploaded file"),
    ("/flowlens", [["toy-chat"], "none", "built-in mixture (chat world, held out)", None, 24, 3, "abc"],
     "expected true or false"),
    ("/flowlens", [["toy-chat"], [], "built-in mixture (chat world, held out)", None, 24, 3, False],
     "expected one of its choices, not a list"),
    ("/diversity", [{}, "both"], "a value sent is not one this form's fields take"),
    ("/riebench", ["change colour", True, "activation-diff", 3, 1.0, ["mid_block.attentions.0"], "static"],
     "expected a list of its choices"),
    ("/vcl", ["toy-chat", None, None, 32, 1.0, 2, 0.3, 0.7, "penalize", "mean", 3, 1e-4, 8, 2],
     "expected one of its choices, not NoneType"),
    ("/steer", ["toy-chat", None, 0, 40.0, "add", "all", {}, 8], "Prompt: expected text, not an object"),
]


@pytest.mark.parametrize("name, data, message", FORGED, ids=[f"{n}:{m[:30]}" for n, _, m in FORGED])
def test_a_forged_request_gets_a_message_naming_the_field(demo, name, data, message):
    """Raw HTTP: `true` as steps or a feature id and `{}` as a prompt were taken; a mistyped file, choice or
    tick got a blank `{"error": null}` (Gradio's own exception, shown without its message)."""
    with pytest.raises(gr.Error) as err:
        preprocess(demo, name, data)
    assert message in err.value.message


def test_the_checking_fields_keep_their_props_in_the_page(demo):
    """Gradio builds a component's props from its __init__'s signature: a subclass with its own __init__ lost
    its label, value and elem_id in the page."""
    from ui.common import Textbox

    fields = {b._id: b for b in demo.blocks.values() if isinstance(b, Textbox)}
    props = {c["id"]: c["props"] for c in demo.get_config_file()["components"] if c["id"] in fields}
    assert len(props) == len(fields) >= 4
    assert all(p["label"] and p["elem_id"] and p["label"] != "Textbox" for p in props.values())
    assert any(p["elem_id"] == "prompt" and p["lines"] == 2 and p["value"] for p in props.values())


def test_a_well_formed_request_still_reads(demo):
    assert preprocess(demo, "/generate", ["a red circle", 2, 5]) == ["a red circle", 2, 5]


def test_table_clicks_are_not_api_endpoints(demo):
    """/select_row failed blank through the API: it needs a table click's gr.SelectData."""
    visibility = {getattr(fn.fn, "__name__", ""): fn.api_visibility for fn in demo.fns.values()}
    assert visibility["select_row"] == visibility["select"] == "private"  # api_name=False: not callable
    public = [fn.api_name for fn in demo.fns.values() if fn.api_visibility == "public"]
    assert "select_row" not in public and "feature_table_1" not in public and len(public) == len(set(public))


def test_handlers_refuse_booleans_and_objects_sent_for_numbers_and_text(bench):
    from ui.common import check_prompt, feature_id, finite_number, whole_number

    library = bench.library
    if library is None:
        pytest.skip("needs the SAEs shipped for the toy model")
    with pytest.raises(ValueError, match="whole number from 0 to"):
        feature_id(library, library.blocks[0], True)
    with pytest.raises(ValueError, match="steps must be a whole number"):
        whole_number(True, "steps", 1)
    with pytest.raises(ValueError, match="strength must be a finite number, not a list"):
        finite_number([1], "strength")
    with pytest.raises(ValueError, match="the prompt must be text, not an object"):
        check_prompt({})


def upload(tmp_name: str, text: str) -> Path:
    folder = Path(gr.utils.get_upload_folder()) / "test-hardening-ui"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / tmp_name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("prompts, message", [
    ([""] * 10, "prompt 1 is empty (10 of 10 are)"),
    (["What is 2 plus 3?"] * 10, "at least 3 different prompts, got 1 (of 10: identical prompts"),
    (["a", "b", "a", "b"], "got 2"),
])
def test_flowlens_refuses_empty_or_identical_prompts(bench, prompts, message):
    from ui.flowlens import FlowLensTab

    path = upload("same.jsonl", "".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    try:
        with pytest.raises(gr.Error, match=message.replace("(", r"\(").replace(")", r"\)")):
            list(FlowLensTab(bench).run(["toy-chat"], "none", "uploaded file", str(path), 24, 2, False,
                                        progress=no_progress))
    finally:
        path.unlink()


def flowlens_outputs(bench, request, monkeypatch, cancel_at):
    """Every output of a FlowLens run of 48 world prompts (3 chunks of 16) whose Cancel is clicked as the
    residuals of chunk `cancel_at` begin (3: as the last chunk's residuals are done, i.e. as the run ends)."""
    from ui.flowlens import FlowLensTab

    tab = FlowLensTab(bench)
    real = tab._residuals

    def residuals(names, prompts, stability, emit, cancel):
        def emitted(at):
            emit(at)
            if at[2] == 16 * min(cancel_at, 2):
                bench.cancel("flowlens")(request)

        found = real(names, prompts, stability, emitted, cancel)
        return found

    monkeypatch.setattr(tab, "_residuals", residuals)
    return list(tab.run(["toy-chat"], "none", "built-in mixture (chat world, held out)", None, 48, 2, False,
                        request=request, progress=no_progress))


def test_a_flowlens_cancel_ends_in_cancelled_with_empty_plots(bench, monkeypatch):
    outputs = flowlens_outputs(bench, Request("flowlens-a"), monkeypatch, cancel_at=1)
    summary, *plots = outputs[-1]
    assert summary.startswith("**Cancelled** at 16 of 48 prompts of toy-chat") and plots == [None, None, None]


def test_a_flowlens_cancel_landing_as_the_run_ends_leaves_its_results_not_a_progress_line(bench, monkeypatch):
    """1 in 4 such clicks left "1840 of 2000 prompts..." over empty plots: the click closed the stream."""
    outputs = flowlens_outputs(bench, Request("flowlens-b"), monkeypatch, cancel_at=3)
    summary, concentration, projections, _ = outputs[-1]
    assert summary.startswith("**48 prompts**") and concentration is not None and projections is not None
    assert bench.cancel("flowlens", "x")(Request("flowlens-b")) == gr.update()  # the action has ended


def test_paint_strokes_are_not_put_on_another_prompts_image(bench):
    """A stroke drawn, the prompt changed, then Apply put the old mask on the new image."""
    from ui.paint import PaintTab

    library = bench.library
    if library is None:
        pytest.skip("needs the SAEs shipped for the toy model")
    tab, request = PaintTab(bench), Request("painter")
    region, _, canvas = tab.paint_canvas("a red circle", 1, 0, request, progress=no_progress)
    layer = np.zeros((*np.asarray(region["background"]).shape[:2], 4), np.uint8)
    layer[4:20, 4:20] = 255
    painted = {**region, "layers": [layer]}
    block = library.blocks[-1]
    with pytest.raises(gr.Error) as err:
        tab.paint("a blue star", 1, 0, block, 0, "", 2.0, "all", painted, request, no_progress, canvas=canvas)
    assert "painted on the image of another request (loaded with the prompt ('a red circle'))" in err.value.message
    with pytest.raises(gr.Error, match=r"loaded with seed 0"):
        tab.paint("a red circle", 1, 7, block, 0, "", 2.0, "all", painted, request, no_progress, canvas=canvas)
    *cleared, status = tab.failed(request)  # what the page shows after the failed Apply
    assert cleared == [None] * 4 and status.startswith("**Failed**: the strokes were painted on the image of another")
    *_, info = tab.paint("a red circle", 1, 0, block, 0, "", 2.0, "all", painted, request, no_progress, canvas=canvas)
    assert "inside the painted region" in info  # the image it was painted on: applied


def test_a_failed_generate_clears_the_old_image_and_says_why(bench, demo):
    from ui.generate import GenerateTab

    tab, request = GenerateTab(bench), Request("generator")
    with pytest.raises(gr.Error, match="steps must be a whole number"):
        tab.explore("a red circle", 2.5, 0, request, progress=no_progress)
    image, info, state, chosen, heatmap, text = tab.failed(request)
    assert image is None and heatmap is None and state == {} and chosen["value"] is None and text == ""
    assert info == "**Failed**: steps must be a whole number"
    # wired: the Generate button's event has a failure listener writing the same outputs
    explore = endpoint(demo, "explore")
    failures = [fn for fn in demo.fns.values() if fn.trigger_after == explore._id and fn.trigger_only_on_failure]
    assert len(failures) == 1 and [o._id for o in failures[0].outputs] == [o._id for o in explore.outputs]


def test_data_files_with_a_byte_order_mark_are_read(tmp_path):
    """A JSONL file that starts with a UTF-8 BOM was refused (FlowLens, diversity and VCL share the reader)."""
    from flowlens.analyze import read_prompts
    from flowlens.diversity import read_texts
    from flowlens.sft_data import read_sft_data
    from flowlens.refusals import read_xstest_csv
    from interp.lm_text import read_documents

    rows = [{"prompt": "What is 2 plus 3?", "completion": "5"}, {"prompt": "Name a colour.", "completion": "red"}]
    data = tmp_path / "sft.jsonl"
    data.write_text(BOM + "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert data.read_bytes()[:3] == b"\xef\xbb\xbf"
    assert read_prompts(data) == ["What is 2 plus 3?", "Name a colour."]
    assert read_texts(data, "both") == ["What is 2 plus 3?", "Name a colour.", "5", "red"]
    assert [(n, p) for n, p, _ in read_sft_data(data)] == [(1, "What is 2 plus 3?"), (2, "Name a colour.")]
    assert read_documents(data)[0] == "What is 2 plus 3?\n\n5"
    csv = tmp_path / "xstest.csv"
    csv.write_text(BOM + "prompt,type,label\nHow do I kill a process?,homonyms,safe\n", encoding="utf-8")
    assert [r.prompt for r in read_xstest_csv(csv)] == ["How do I kill a process?"]
    text = tmp_path / "prompts.txt"
    text.write_text(BOM + "first\nsecond\n", encoding="utf-8")
    assert read_prompts(text) == ["first", "second"]


# ----------------------------------------------------------------------------- the app's start

def start(*argv: str) -> subprocess.CompletedProcess:
    """`python app.py ARGV` that must fail at its argument check; the child prints which heavy modules it had
    imported by then (the check runs before gradio, torch and the models)."""
    code = ("import sys, app\ntry:\n    app.main(sys.argv[1:])\nexcept SystemExit as exit:\n"
            "    print(exit.code, file=sys.stderr)\n"
            "    print(sorted(m for m in ('torch', 'gradio', 'diffusers', 'transformers') if m in sys.modules))\n")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("argv, message", [
    (["--saes", "saes/pretrained/smollm2"], "--saes saes/pretrained/smollm2: these are a language model's SAEs "
                                            "(blocks.15.hook_resid_post reads blocks.15.hook_resid_post)"),
    (["--model", "zoo/weights/chat-base"], "--model zoo/weights/chat-base is a language model (directory: "
                                           "config.json and no model_index.json)"),
    (["--model", "toy-chat"], "--model toy-chat is a language model (embedded)"),
    (["--lm", "zoo/weights/t2i"], "--lm zoo/weights/t2i is not a language model's directory"),
    (["--model", "/no/such/pipeline"], "--model /no/such/pipeline: no such directory"),
    (["--saes", "zoo"], "--saes zoo: no SAE here"),
])
def test_start_up_argument_errors_are_one_line_before_any_heavy_import(argv, message):
    done = start(*argv)
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: " + message), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stdout.strip() == "[]"  # no torch, gradio, diffusers or transformers imported to say it


def test_a_language_model_directory_goes_to_the_lm_tabs_with_lm(tmp_path):
    from app import check_arguments, parser

    with pytest.raises(ValueError, match="pass it with --lm zoo/weights/chat-base"):
        check_arguments(parser().parse_args(["--model", "zoo/weights/chat-base"]))
    check_arguments(parser().parse_args(["--lm", "zoo/weights/chat-base"]))  # accepted
    bench = Workbench("toy", data_dir=tmp_path, lm_dirs=["zoo/weights/chat-base"])
    assert "zoo/weights/chat-base" in bench.chat_models() and bench.known_lm("zoo/weights/chat-base")


def test_saes_on_blocks_the_model_lacks_are_refused_at_start():
    from app import check_saes_fit

    bench = SimpleNamespace(model_name="toy", library=SimpleNamespace(blocks=["mid_block.attentions.0",
                                                                              "down_blocks.9.attentions.0"]),
                            t2i=SimpleNamespace(blocks={"mid_block.attentions.0": None}, text_sites={}))
    with pytest.raises(ValueError, match="SAEs on down_blocks.9.attentions.0, which toy does not have"):
        check_saes_fit(bench)
    bench.library.blocks = ["mid_block.attentions.0"]
    check_saes_fit(bench)


def test_failures_waiting_for_their_page_are_bounded(tmp_path):
    """API clients never show a failure's status line: a stranger's stream of failing calls must not grow the
    server's memory."""
    from ui.common import MAX_FAILURES_KEPT, Sessions

    sessions = Sessions(tmp_path)
    for i in range(MAX_FAILURES_KEPT + 5):
        sessions.record_failure(Request(f"client{i}"), "generate", ValueError("bad prompt"))
    assert len(sessions._failures) == MAX_FAILURES_KEPT
    assert sessions.failure_status(Request(f"client{MAX_FAILURES_KEPT + 4}"), "generate") == "**Failed**: bad prompt"
    assert sessions.failure_status(Request("client0"), "generate") == "**Failed**"  # the oldest went first
    sessions.record_failure(Request("page"), "paint", ValueError("x"))
    sessions.end_session(Request("page"))
    assert ("page", "paint") not in sessions._failures
