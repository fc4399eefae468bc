"""Issue 32 (hardening, round 3): files shipped with the repository are written only with --overwrite, and nothing
wrong is accepted silently: each case the issue lists is refused with a line naming the value and what is allowed
(or, for a folder that does not exist yet, made), in the command lines and in the UI."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import gradio as gr
import pytest

import flowlens.__main__
import interp.__main__
import interp.cli
import riebench.__main__
import saes.__main__
from interp.shipped import MARKER, OUTPUT_OPTIONS, ShippedFilesError, is_shipped, refuse_shipped, shipped_roots
from zoo import WEIGHTS_DIR
from saes.library import PRETRAINED_DIR
from test_cli_input_errors import run_cli, toy_loaded  # noqa: F401 (a fixture)
from test_saes_cli import small_store

MID = "mid_block.attentions.0"
SHIPPED_SAE = PRETRAINED_DIR / "toy" / MID
PROMPT = "a small red circle at the top left on a blue background"


@pytest.fixture(scope="module")
def store() -> Path:
    """test_saes_cli's 8-image store, built outside any test's captured output: the first diffusers import binds
    its logging handler to the stream of the moment, and a test's own stream is closed when the test ends."""
    return small_store()


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def marked_copy(tmp_path: Path) -> Path:
    """A directory that carries the shipped marker, as a copy of a whole shipped root does."""
    root = tmp_path / "copy-of-pretrained"
    root.mkdir()
    (root / MARKER).write_text("shipped\n")
    return root


# ----------------------------------------------------------------------------- the guard itself

def test_shipped_files_are_found_by_location_and_by_the_marker_of_a_copied_root(tmp_path):
    assert all((root / MARKER).is_file() for root in shipped_roots())  # each shipped root carries the marker
    assert is_shipped(WEIGHTS_DIR / "t2i" / "recipe.json") and is_shipped(SHIPPED_SAE / "eval.json")
    assert is_shipped(WEIGHTS_DIR / "not-yet" / "deeper")  # a path that does not exist yet, inside a root
    root = marked_copy(tmp_path)
    assert is_shipped(root / "toy" / MID)
    shutil.copytree(SHIPPED_SAE, tmp_path / "mine" / MID)  # one SAE copied out carries no marker: the user's own
    assert not is_shipped(tmp_path / "mine" / MID) and not is_shipped(tmp_path / "elsewhere")
    with pytest.raises(ShippedFilesError, match=rf"saes x would rewrite files shipped with the repository "
                                                rf"\({root / 'a'}, under {root}, marked shipped by its SHIPPED file\); "
                                                r"write to a directory of your own instead"):
        refuse_shipped([tmp_path / "elsewhere", root / "a"], "saes x")


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def _entry_points():
    from zoo import __main__ as zoo_main
    from zoo.chat import recipe as chat_recipe

    return {"interp": interp.__main__.main, "zoo": zoo_main.main, "zoo.chat.recipe": chat_recipe.cli,
            "saes": saes.__main__.main, "riebench": riebench.__main__.main, "flowlens": flowlens.__main__.main}


def _leaves(parser, path=()):
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _leaves(sub, path + (name,))


def cli_commands() -> list[tuple[str, tuple, argparse.ArgumentParser]]:
    """Every command of every command line: (entry point, subcommand path, its parser), read from the parsers the
    entry points build (parse_args is stopped before it parses)."""
    commands = []
    original = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        for name, main in _entry_points().items():
            try:
                main([])
            except _Captured as captured:
                commands += [(name, path, leaf) for path, leaf in _leaves(captured.parser)]
    finally:
        argparse.ArgumentParser.parse_args = original
    return commands


COMMANDS = cli_commands()
WRITERS = [(name, path, leaf) for name, path, leaf in COMMANDS if any(a.dest in OUTPUT_OPTIONS for a in leaf._actions)]


def test_the_command_lines_writers_are_all_found():
    found = {" ".join((name,) + path) for name, path, _ in WRITERS}
    assert {"interp generate", "interp collect", "zoo train t2i", "zoo train chat", "zoo evaluate",
            "interp fetch", "zoo.chat.recipe", "saes train", "saes eval", "saes features", "saes report",
            "saes probe", "saes import-sdxl", "riebench tasks", "riebench run", "riebench sweep", "riebench report",
            "flowlens diversity", "flowlens vcl", "flowlens refusals", "flowlens analyze"} <= found
    assert len(COMMANDS) > len(WRITERS)  # commands that only read (interp blocks, saes causal's cards aside) exist


def test_no_option_names_an_output_that_the_guard_does_not_check():
    """An output option the guard does not know (--output, --out-dir, --save-dir) would let the next command write
    into shipped files: every option named like one is in OUTPUT_OPTIONS."""
    for name, path, leaf in COMMANDS:
        for action in leaf._actions:
            looks_like_output = action.dest.startswith(("out", "output")) or action.dest.endswith(
                ("_out", "_output", "_to", "_dir"))
            if looks_like_output:
                assert action.dest in OUTPUT_OPTIONS, f"{name} {' '.join(path)}: {action.dest}"


def _argv(path: tuple, leaf: argparse.ArgumentParser, out: Path) -> list[str]:
    """The command with every required argument given a placeholder and each output option pointing at `out`."""
    argv = list(path)
    one_of = {group._group_actions[0].dest for group in leaf._mutually_exclusive_groups if group.required}
    for action in leaf._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.dest in OUTPUT_OPTIONS:
            value = str(out / action.dest)
        elif action.required or not action.option_strings or action.dest in one_of:
            value = str(next(iter(action.choices))) if action.choices else "1"
        else:
            continue
        count = action.nargs if isinstance(action.nargs, int) else 1
        argv += action.option_strings[:1] + [value] * count
    return argv


@pytest.mark.parametrize("name,path,leaf", WRITERS, ids=[" ".join((n,) + p) for n, p, _ in WRITERS])
def test_every_command_that_writes_refuses_a_shipped_output_unless_overwrite(name, path, leaf, tmp_path, capsys,
                                                                              monkeypatch):
    ran = []
    real = interp.cli.run_command

    def commands_do_not_run(args, interrupted="interrupted"):
        args.run = lambda a: ran.append(a) or 0
        return real(args, interrupted)

    for module in (interp.cli, interp.__main__, saes.__main__, riebench.__main__, flowlens.__main__):
        monkeypatch.setattr(module, "run_command", commands_do_not_run)
    root = marked_copy(tmp_path)
    argv = _argv(path, leaf, root / "out")
    main = _entry_points()[name]
    code, err = run_cli(main, argv, capsys)
    assert code == 2 and "would rewrite files shipped with the repository" in err and "--overwrite" in err, err
    assert not ran and sorted(p.name for p in root.iterdir()) == [MARKER]
    code, err = run_cli(main, argv + ["--overwrite"], capsys)
    assert code == 0 and len(ran) == 1, err


def test_saes_train_into_a_shipped_sae_is_refused_and_the_sae_is_unchanged(capsys):
    before = digests(SHIPPED_SAE)
    code, err = run_cli(saes.__main__.main, ["train", "--store", "runs/none", "--block", MID, "--out",
                                             str(SHIPPED_SAE)], capsys)
    assert code == 2 and f"saes train would rewrite files shipped with the repository ({SHIPPED_SAE}" in err
    assert "write to a directory of your own instead (e.g. --out runs/NAME)" in err
    assert digests(SHIPPED_SAE) == before


@pytest.mark.parametrize("argv", [["train", "t2i", "--out", str(WEIGHTS_DIR / "t2i")],
                                  ["train", "t2i", "--save-to", str(WEIGHTS_DIR / "t2i")],
                                  ["evaluate", "--out", str(WEIGHTS_DIR / "t2i")],
                                  ["train", "chat"]],  # the chat recipe ships into zoo/weights by default
                         ids=["train --out", "train --save-to", "evaluate --out", "train chat (default)"])
def test_the_zoo_recipes_refuse_to_write_into_the_shipped_weights(argv, capsys):
    from zoo.__main__ import main

    before = digests(WEIGHTS_DIR / "t2i")
    code, err = run_cli(main, argv, capsys)
    assert code == 2 and "would rewrite files shipped with the repository" in err
    assert digests(WEIGHTS_DIR / "t2i") == before


def test_the_chat_worlds_export_refuses_a_shipped_folder(tmp_path, capsys):
    from zoo.chat.__main__ import main

    root = marked_copy(tmp_path)
    code, err = run_cli(main, ["world", "--out", str(root / "world"), "--n", "2"], capsys)
    assert code == 2 and "zoo.chat world would rewrite files shipped" in err
    assert not (root / "world").exists()
    assert run_cli(main, ["world", "--out", str(tmp_path / "world"), "--n", "2"], capsys)[0] == 0


def test_saes_eval_of_a_shipped_sae_writes_under_runs_eval_and_leaves_the_shipped_directory(store, tmp_path, capsys,
                                                                                          monkeypatch):
    from saes.evaluate import default_eval_path

    monkeypatch.chdir(tmp_path)
    before = digests(SHIPPED_SAE)
    assert saes.__main__.main(["eval", "--sae", str(SHIPPED_SAE), "--store", str(store)]) == 0
    assert digests(SHIPPED_SAE) == before
    written = tmp_path / "runs" / "eval" / "pretrained" / "toy" / MID / "eval.json"
    assert json.loads(written.read_text())["block"] == MID and written.with_suffix(".md").exists()
    assert f"wrote {Path('runs/eval/pretrained/toy') / MID / 'eval.json'}" in capsys.readouterr().out
    mine = tmp_path / "mine"
    shutil.copytree(SHIPPED_SAE, mine)
    assert default_eval_path(mine) == mine.resolve() / "eval.json"  # the user's own SAE: beside it, as before
    assert default_eval_path(SHIPPED_SAE, overwrite=True) == SHIPPED_SAE / "eval.json"


# ----------------------------------------------------------------------------- values out of range

def test_a_training_batch_of_0_is_refused(tmp_path, capsys):
    from zoo.__main__ import main

    code, err = run_cli(main, ["train", "t2i", "--batch", "0", "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and "argument --batch: must be at least 1, got 0" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["2", "-0.1", "nan"])
def test_probability_like_options_lie_in_0_to_1(value, tmp_path, capsys):
    code, err = run_cli(saes.__main__.main, ["features", "--sae", str(tmp_path), "--world", "2", "--out",
                                             str(tmp_path / "o"), "--label-min-auroc", value], capsys)
    assert code == 2 and f"argument --label-min-auroc: must be from 0 to 1, got {value}" in err
    for command in (["run", "--out", str(tmp_path / "r")], ["report", str(tmp_path / "r")]):
        code, err = run_cli(riebench.__main__.main, command + ["--min-preservation", value], capsys)
        assert code == 2 and f"argument --min-preservation: must be from 0 to 1, got {value}" in err


def test_features_refuses_more_images_than_the_store_holds(store, toy_loaded, tmp_path, capsys):
    mine = tmp_path / "saes" / MID
    shutil.copytree(SHIPPED_SAE, mine)
    before = digests(mine)
    code, err = run_cli(saes.__main__.main, ["features", "--sae", str(mine), "--store", str(store), "--images",
                                             "99999", "--out", str(tmp_path / "cards")], capsys)
    assert code == 2 and f"--images 99999: the store at {store} holds 8 images; give at most 8" in err
    assert not (tmp_path / "cards").exists() and digests(mine) == before


# ----------------------------------------------------------------------------- riebench

def test_riebench_refuses_saes_trained_on_another_model(toy_loaded, tmp_path, capsys):
    code, err = run_cli(riebench.__main__.main, ["run", "--saes", str(PRETRAINED_DIR / "toy-v2"), "--blocks", MID,
                                                 "--limit-per-category", "1", "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and f"the SAEs in {PRETRAINED_DIR / 'toy-v2'} were trained on toy-v2" in err
    assert "not on toy: use SAEs of toy" in err
    assert not list((tmp_path / "run").glob("results/*/*.json"))


def test_feature_cards_of_another_models_saes_are_refused(toy_loaded, tmp_path, capsys):
    theirs = tmp_path / "toy-v2-saes" / MID
    shutil.copytree(PRETRAINED_DIR / "toy-v2" / MID, theirs)
    code, err = run_cli(saes.__main__.main, ["features", "--sae", str(theirs), "--world", "2", "--out",
                                             str(tmp_path / "cards")], capsys)
    assert code == 2 and f"the SAEs in {theirs} were trained on toy-v2" in err and "not on toy" in err
    assert not (tmp_path / "cards").exists()


def test_a_results_directory_holds_one_runs_configuration(toy_loaded, tmp_path, capsys):
    from riebench.methods import MethodConfig
    from riebench.runner import RunConfig, RunError, check_same_run

    out = tmp_path / "run"
    (out / "results" / "x").mkdir(parents=True)
    (out / "results" / "x" / "t.json").write_text("{}")
    first = RunConfig(model="toy-v2", configs=[MethodConfig("prompt-swap", blocks=[MID])])
    (out / "run.json").write_text(json.dumps({"run": first.to_dict()}))
    check_same_run(out, first)  # the same run again: resumed
    check_same_run(out, RunConfig(model="toy-v2", configs=[MethodConfig("prompt-swap", blocks=[MID])],
                                  save_images=True))
    with pytest.raises(RunError, match=r'holds the results of another run \(model: "toy-v2" there, "toy" here\)'):
        check_same_run(out, RunConfig(model="toy", configs=[MethodConfig("prompt-swap", blocks=[MID])]))
    code, err = run_cli(riebench.__main__.main, ["run", "--method", "prompt-swap", "--blocks", MID,
                                                 "--limit-per-category", "1", "--out", str(out)], capsys)
    assert code == 2 and f"{out} holds the results of another run (model:" in err
    (out / "run.json").unlink()
    with pytest.raises(RunError, match="holds results but no run.json"):
        check_same_run(out, first)


def test_riebench_report_refuses_a_directory_without_a_readable_run(tmp_path, capsys):
    main = riebench.__main__.main
    code, err = run_cli(main, ["report", str(tmp_path / "missing")], capsys)
    assert code == 2 and "is not a directory: give the --out of a `python -m riebench run`" in err
    (tmp_path / "empty").mkdir()
    code, err = run_cli(main, ["report", str(tmp_path / "empty")], capsys)
    assert code == 2 and "holds no RIEBench run (no run.json, no results/)" in err
    corrupt = tmp_path / "corrupt"
    (corrupt / "results" / "sae__k2").mkdir(parents=True)
    (corrupt / "run.json").write_text("{}")
    code, err = run_cli(main, ["report", str(corrupt)], capsys)
    assert code == 2 and "holds no results yet" in err
    (corrupt / "results" / "sae__k2" / "t1.json").write_text('{"label": "sae", "metr')
    code, err = run_cli(main, ["report", str(corrupt)], capsys)
    assert code == 2 and "1 result file(s) cannot be read" in err and "t1.json" in err
    assert not (corrupt / "report.json").exists() and not (tmp_path / "empty" / "report.json").exists()


def test_the_multiplier_has_a_sane_range():
    from riebench.methods import MULTIPLIER_RANGE, MethodConfig, MethodError

    for m in (1e30, -1.0, 10.5, float("inf")):
        with pytest.raises(MethodError, match=r"the multiplier m must be from 0 to 10, not"):
            MethodConfig("activation-diff", 3, m, [MID])
    assert MethodConfig("activation-diff", 3, MULTIPLIER_RANGE[1], [MID]).multiplier == 10.0


# ----------------------------------------------------------------------------- interp generate

@pytest.mark.parametrize("prompt,shown", [("a red circle 🔴 on a white background", "'🔴' (U+1F534)"),
                                          ("دائرة حمراء", "'ء' (U+0621)")], ids=["emoji", "rtl"])
def test_the_toy_refuses_prompts_in_characters_it_cannot_read(prompt, shown, toy_loaded, tmp_path, capsys):
    out = tmp_path / "image.png"
    code, err = run_cli(interp.__main__.main, ["generate", "--prompt", prompt, "--out", str(out)], capsys)
    assert code == 2 and f"toy cannot read the character(s) {shown}" in err and "it knows: a, against" in err
    assert not out.exists()


def test_generate_makes_the_folder_of_its_output(toy_loaded, tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "image.png"
    assert run_cli(interp.__main__.main, ["generate", "--prompt", PROMPT, "--out", str(out)], capsys)[0] == 0
    assert out.is_file()


# ----------------------------------------------------------------------------- the UI

def test_a_field_sent_something_that_is_not_a_number_names_itself():
    from ui.common import Number, Slider

    for field in (Number(label="Steps", minimum=1), Slider(0, 8, label="Strength")):
        with pytest.raises(gr.Error, match=rf"{field.label}: 'abc' is not a number") as err:
            field.preprocess("abc")
        assert err.value.print_exception is False
    assert Number(label="Steps", minimum=1).preprocess("3") == 3.0  # a number sent as text reads as the number


@pytest.mark.parametrize("content", [b"just some text\n", bytes(range(256)) * 4], ids=["text", "binary"])
def test_a_paint_region_that_is_not_an_image_names_the_field(content, tmp_path):
    from gradio.components.image_editor import EditorData
    from gradio.data_classes import FileData

    from ui.common import ImageEditor

    path = tmp_path / "region.png"
    path.write_bytes(content)
    payload = EditorData(background=FileData(path=str(path)), layers=[], composite=FileData(path=str(path)))
    with pytest.raises(gr.Error, match=r"Paint the region: the uploaded file is not an image this field can read"):
        ImageEditor(label="Paint the region", type="numpy").preprocess(payload)


def test_paints_steps_must_be_ascii_ranges_from_low_to_high():
    from ui.paint import parse_steps

    with pytest.raises(ValueError, match=r"the step range '3-1' runs backwards: write it low to high \('1-3'\)"):
        parse_steps("3-1", 4)
    for text in ("٣", "1-٣", "²"):
        with pytest.raises(ValueError, match="steps are numbers or ranges like '0,2-3' or 'all'"):
            parse_steps(text, 4)
    assert parse_steps("0, 2-3", 4) == [0, 2, 3]


@pytest.fixture
def bench(tmp_path):
    from app import Workbench

    return Workbench("toy", data_dir=tmp_path / "data")


def test_the_riebench_tab_refuses_a_multiplier_outside_its_range(bench):
    from ui.riebench import RIEBenchTab

    with pytest.raises(gr.Error, match=r"the multiplier m must be from 0 to 10, not 1e\+30"):
        list(RIEBenchTab(bench).run("change colour", ["change-colour-000"], "activation-diff", 3, 1e30, [MID],
                                    "static", None, progress=lambda *a, **k: None))


def test_flowlens_refuses_more_components_than_prompts(bench):
    from flowlens.analyze import checked_components
    from flowlens.diversity import DataError
    from ui.flowlens import WORLD_PROMPT_SETS, FlowLensTab

    source = next(iter(WORLD_PROMPT_SETS))
    with pytest.raises(gr.Error, match=r"40 principal components from 8 prompts: ask for 1 to 8"):
        list(FlowLensTab(bench).run(["toy-chat"], "none", source, None, 8, 40, False, None,
                                    progress=lambda *a, **k: None))
    assert checked_components(8, 8) == 8 and checked_components("twonn", 3) == "twonn"
    with pytest.raises(DataError, match="a whole number or 'twonn', not 'many'"):
        checked_components("many", 8)


def test_flowlens_on_smollm2_not_fetched_gives_the_fetch_command(bench, tmp_path, monkeypatch):
    from ui.flowlens import WORLD_PROMPT_SETS, FlowLensTab

    monkeypatch.setenv("INTERP_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(gr.Error, match=r"smollm2-135m-instruct is not fetched on this machine: run "
                                       r"`python -m interp fetch smollm2-135m-instruct`"):
        list(FlowLensTab(bench).run(["smollm2-135m-instruct"], "none", next(iter(WORLD_PROMPT_SETS)), None, 8, 3,
                                    False, None, progress=lambda *a, **k: None))
