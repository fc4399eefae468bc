"""RIEBench: tasks, metrics against truth, edit methods, runner and report.

Methods run on a random-weight SDXL-built pipeline with random SAEs (the mechanics do not
depend on the weights); the prompt-swap reference is scored on the embedded toy model
when its weights are present."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from interp.hooks import apply_edits, capture_updates, generate
from interp.models.t2i import SDXL_BLOCKS
from zoo import WEIGHTS_DIR, shapes
from riebench.methods import (MethodConfig, MethodError, Method, make_method, prepare_task,
                              register_method, run_plan, select_jointly)
from riebench.metrics import shapes_metrics
from riebench.report import write_report
from riebench.runner import RunConfig, Runner, load_results
from riebench.tasks import (SHAPES_CATEGORIES, ShapesSuiteConfig, Suite, Task, TaskError, read_riebench_json,
                            shapes_suite, strip_brackets)

PUBLIC_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "riebench.json"
MID = "mid_block.attentions.0"


@functools.cache
def suite() -> Suite:
    return shapes_suite(ShapesSuiteConfig(seed=0))


def few_tasks(per_category: int = 1, categories=None) -> Suite:
    return suite().select(categories, per_category)


@functools.cache
def random_model():
    from interp.models.t2i import T2IModel, block_info
    from zoo.t2i import T2IConfig, build_pipeline, build_tokenizer_files

    tokenizer_dir = Path(tempfile.mkdtemp(prefix="riebench-random-t2i-"))
    build_tokenizer_files(tokenizer_dir, 48)
    torch.manual_seed(0)
    pipe = build_pipeline(T2IConfig(), tokenizer_dir)
    pipe.set_progress_bar_config(disable=True)
    # Built by the toy's recipe, untrained: a pipeline that recipe saves is the shapes world's (`recipe_made`).
    return T2IModel(name="random", pipe=pipe, default_steps=1, default_guidance=0.0, blocks=block_info(pipe.unet),
                    world="shapes")


@functools.cache
def random_saes(n_features: int = 128) -> dict:
    from saes.sae import SAE, SAEConfig

    generator = torch.Generator().manual_seed(1)
    saes = {}
    for block in SDXL_BLOCKS:
        sae = SAE(SAEConfig("topk", 64, n_features, k=8))
        with torch.no_grad():
            sae.W_enc.copy_(torch.randn(64, n_features, generator=generator))
            sae.W_dec.copy_(torch.nn.functional.normalize(sae.W_enc.T.clone(), dim=1))
        saes[block] = sae
    return saes


# ----------------------------------------------------------------------------- tasks

def test_shapes_suite_has_thirty_tasks_in_each_of_nine_categories_and_is_reproducible():
    tasks = suite().tasks
    assert suite().categories() == list(SHAPES_CATEGORIES)
    assert all(sum(t.category == c for t in tasks) == 30 for c in SHAPES_CATEGORIES)
    again = shapes_suite(ShapesSuiteConfig(seed=0))
    assert again.to_dict() == suite().to_dict()
    other = shapes_suite(ShapesSuiteConfig(seed=1, per_category=3))
    assert [t.original_prompt for t in other.tasks] != [t.original_prompt for t in few_tasks(3).tasks]
    assert suite().version and suite().seed == 0


def test_suite_file_loads_back_identically(tmp_path):
    path = few_tasks(4).save(tmp_path / "suite.json")
    loaded = Suite.load(path)
    assert loaded.to_dict() == few_tasks(4).to_dict()
    assert all(np.array_equal(a.source_mask, b.source_mask) for a, b in zip(loaded.tasks, few_tasks(4).tasks))


def test_shapes_tasks_have_exact_masks_scenes_and_bracketed_prompts():
    for task in few_tasks(3).tasks:
        original, target = task.scenes()
        assert shapes.parse_caption(task.original) == original and shapes.parse_caption(task.edited) == target
        assert "[" in task.original_prompt + task.editing_prompt and task.original != task.edited
        assert strip_brackets(task.original_prompt) == shapes.caption(original)
        if task.category == "change background":
            assert task.source_mask.all() == False and (task.source_mask | shapes.foreground_mask(original)).all()
            full = max(shapes.object_mask(o).max() for o in original.objects)
            assert full == 1.0 and not task.source_mask[np.unravel_index(
                np.argmax(shapes.object_mask(original.objects[0])), (64, 64))]
        elif task.category == "add object":
            new = next(o for o in target.objects if o.position == task.target_position)
            assert np.array_equal(task.target_mask, shapes.object_mask(new) > 0)
            assert not (shapes.foreground_mask(original) & task.source_mask).any()  # the empty cell
        else:
            old = next(o for o in original.objects if o.position == task.source_position)
            assert np.array_equal(task.source_mask, shapes.object_mask(old) > 0)
        assert not shapes.is_held_out(original) and not shapes.is_held_out(target)  # train split throughout


def test_region_of_the_wrong_size_is_a_clear_error():
    task = few_tasks(1).tasks[0]
    with pytest.raises(TaskError, match=f"task {task.id}: the source mask is 64 x 64 but the image is 32 x 32"):
        task.region("source", (32, 32))
    with pytest.raises(TaskError, match="unknown category 'change hat'"):
        Task("x", "change hat", "a", "b")
    with pytest.raises(TaskError, match="unknown category 'change hat'"):
        suite().select(["change hat"])


@pytest.mark.skipif(not PUBLIC_FILE.exists(), reason="the public RIEBench file is not in ../shared/data")
def test_reads_the_public_riebench_file_with_everything_masks_and_user_pngs(tmp_path):
    public = read_riebench_json(PUBLIC_FILE)
    assert len(public.tasks) == 296
    counts = {c: sum(t.category == c for t in public.tasks) for c in public.categories()}
    assert counts["change style"] == 47 and counts["change background"] == 46 and counts["change pose"] == 20
    assert all(t.source_mask == "#everything" for t in public.tasks)  # no segmenter, no masks given
    first = public.tasks[0]
    mask = np.zeros((64, 64), np.uint8)
    mask[10:20, 5:30] = 255
    from PIL import Image

    Image.fromarray(mask).save(tmp_path / f"{first.id}_source.png")
    with_masks = read_riebench_json(PUBLIC_FILE, tmp_path)
    assert np.array_equal(with_masks.tasks[0].source_mask, mask > 0)
    assert with_masks.tasks[0].target_mask == "#everything"


def test_malformed_task_file_names_the_task_and_the_field(tmp_path):
    good = {"id": "7", "editing_type_id": "6", "original_prompt": "a [red] car", "editing_prompt": "a [blue] car",
            "editing_instruction": "make it blue", "original_gsam_prompt": "car", "editing_gsam_prompt": "car"}
    cases = [({"editing_type_id": "12"}, "task 7: field editing_type_id"),
             ({"original_prompt": None}, "task 7: field original_prompt must be a string"),
             ({"editing_prompt": "a [blue car"}, "task 7: field editing_prompt has unbalanced brackets")]
    for change, message in cases:
        path = tmp_path / "bad.json"
        path.write_text(json.dumps([good, {**good, **change}]))
        with pytest.raises(TaskError, match=message):
            read_riebench_json(path)
    broken = dict(good)
    del broken["editing_gsam_prompt"]
    (tmp_path / "bad.json").write_text(json.dumps([broken]))
    with pytest.raises(TaskError, match="task 7: missing field editing_gsam_prompt"):
        Suite.load(tmp_path / "bad.json")


# ----------------------------------------------------------------------------- metrics

def test_the_exact_target_scores_full_success_and_preservation_and_no_edit_scores_none():
    for task in few_tasks(2).tasks:
        original, target = (shapes.render(s) for s in task.scenes())
        perfect = shapes_metrics(task, target, original)
        assert perfect["success"] == 1.0 and perfect["preservation"] == 1.0, task.id
        assert perfect["target_distance"] == 0.0 and perfect["outside_pixel_distance"] == 0.0
        nothing = shapes_metrics(task, original, original)
        assert nothing["success"] == 0.0 and nothing["preservation"] == 1.0, task.id


def test_preservation_drops_when_an_untouched_object_changes():
    task = next(t for t in few_tasks(10, ["change colour"]).tasks if len(t.original_scene["objects"]) == 2)
    original, target = task.scenes()
    other = next(o for o in target.objects if o.position != task.target_position)
    spoiled = shapes.replace_object(target, other.position, shape="star" if other.shape != "star" else "circle")
    result = shapes_metrics(task, shapes.render(spoiled), shapes.render(original))
    assert result["success"] == 1.0 and result["preservation"] < 1.0 and result["outside_pixel_distance"] > 0


# ----------------------------------------------------------------------------- methods

def test_joint_selection_takes_the_highest_and_lowest_scores_across_blocks():
    scores = {"a": torch.tensor([0.1, -0.5, 0.9]), "b": torch.tensor([0.7, -0.2, 0.0])}
    top, bottom = select_jointly(scores, 2)
    assert [(b, i) for b, i, _ in top] == [("a", 2), ("b", 0)]
    assert [(b, i) for b, i, _ in bottom] == [("a", 1), ("b", 1)]
    with pytest.raises(MethodError, match="k_trans=7 is larger than the 6 units"):
        select_jointly(scores, 7)


def test_k_trans_larger_than_the_features_is_a_clear_error():
    method = make_method("sae", random_model(), random_saes())
    with pytest.raises(MethodError, match="k_trans=600 is larger than the 512 SAE features"):
        method.check(MethodConfig("sae", k_trans=600))
    with pytest.raises(MethodError, match="unknown method 'magic'"):
        MethodConfig("magic")


@pytest.mark.parametrize("variant", ["static", "adaptive"])
def test_sae_transport_edits_only_inside_the_task_regions_of_the_chosen_block(variant):
    model, saes = random_model(), random_saes()
    task = few_tasks(1, ["change shape"]).tasks[0]
    ctx = prepare_task(model, task, [MID])
    config = MethodConfig("sae", k_trans=4, multiplier=3.0, blocks=[MID], variant=variant)
    plan = make_method("sae", model, saes).plan(ctx, config)
    assert plan.selected and {u["block"] for u in plan.selected} == {MID} and {e.block for e in plan.edits} == {MID}
    with apply_edits(model, plan.edits, saes=plan.saes), capture_updates(model, [MID]) as cap:
        generate(model, task.original, steps=1, seed=ctx.seed)
    delta = (cap.updates(MID)[0, 0] - ctx.updates_original[MID][0]).norm(dim=0).numpy()
    region = np.maximum(ctx.source_region[MID], ctx.target_region[MID])
    assert delta[region > 0].max() > 1e-3
    assert np.allclose(delta[region == 0], 0.0, atol=1e-5)


def test_static_transport_adds_edited_pass_activations_times_decoder_rows():
    model, saes = random_model(), random_saes()
    task = few_tasks(1, ["change colour"]).tasks[0]
    ctx = prepare_task(model, task, [MID])
    plan = make_method("sae", model, saes).plan(ctx, MethodConfig("sae", k_trans=3, multiplier=2.0, blocks=[MID]))
    sae = saes[MID]
    codes = lambda u: sae.encode(u[0].permute(1, 2, 0)).detach()  # (H, W, F)
    expected = torch.zeros_like(ctx.updates_original[MID][0])
    for unit in plan.selected:
        f = unit["unit"]
        if unit["sign"] > 0:
            amount = torch.as_tensor(ctx.target_region[MID]) * codes(ctx.updates_edited[MID])[:, :, f]
        else:
            amount = -torch.as_tensor(ctx.source_region[MID]) * codes(ctx.updates_original[MID])[:, :, f]
        expected += 2.0 * amount[None] * sae.W_dec[f].detach()[:, None, None]
    with apply_edits(model, plan.edits, saes=plan.saes), capture_updates(model, [MID]) as cap:
        generate(model, task.original, steps=1, seed=ctx.seed)
    assert torch.allclose(cap.updates(MID)[0, 0] - ctx.updates_original[MID][0], expected, atol=1e-4)


def test_zero_multiplier_regenerates_the_original_image():
    model, saes = random_model(), random_saes()
    task = few_tasks(1, ["move object"]).tasks[0]
    ctx = prepare_task(model, task, list(SDXL_BLOCKS), neurons=True)
    for name in ("sae", "neurons", "activation-diff"):
        plan = make_method(name, model, saes).plan(ctx, MethodConfig(name, k_trans=3, multiplier=0.0))
        assert plan.edits, name
        image = np.asarray(run_plan(model, ctx, plan), np.float32)
        assert np.abs(image - np.asarray(ctx.original_image, np.float32)).max() <= 1.0, name


def test_full_rank_activation_difference_on_one_block_patches_in_the_edited_update():
    model = random_model()
    task = few_tasks(1, ["change background"]).tasks[0]  # same source and target region
    ctx = prepare_task(model, task, [MID])
    plan = make_method("activation-diff", model).plan(ctx, MethodConfig("activation-diff", k_trans=64, blocks=[MID]))
    with apply_edits(model, plan.edits), capture_updates(model, [MID]) as cap:
        generate(model, task.original, steps=1, seed=ctx.seed)
    inside = torch.as_tensor(ctx.target_region[MID]) > 0
    got, edited, original = cap.updates(MID)[0, 0], ctx.updates_edited[MID][0], ctx.updates_original[MID][0]
    assert torch.allclose(got[:, inside], edited[:, inside], atol=1e-4)
    assert torch.allclose(got[:, ~inside], original[:, ~inside], atol=1e-5)


def test_neuron_baseline_selects_mlp_neurons_of_the_requested_blocks():
    model = random_model()
    task = few_tasks(1, ["change size"]).tasks[0]
    ctx = prepare_task(model, task, [MID, "up_blocks.0.attentions.1"], neurons=True)
    config = MethodConfig("neurons", k_trans=5, blocks=[MID, "up_blocks.0.attentions.1"])
    plan = make_method("neurons", model).plan(ctx, config)
    assert 0 < len(plan.selected) <= 10
    assert {u["block"] for u in plan.selected} <= {MID, "up_blocks.0.attentions.1"}
    assert all(u["unit"] < 256 for u in plan.selected)  # GEGLU: 4 x 64 neurons per layer


# ----------------------------------------------------------------------------- runner and report

@register_method("test-fails-on-delete")
class FailsOnDelete(Method):
    """A method that breaks on one category: the runner must keep every other result."""

    def plan(self, ctx, config):
        if ctx.task.category == "delete object":
            raise RuntimeError("broken on purpose")
        return make_method("prompt-swap", self.model).plan(ctx, config)


def test_runner_is_resumable_keeps_finished_results_and_writes_the_report(tmp_path):
    tasks = few_tasks(1, ["change shape", "delete object"])
    configs = [MethodConfig("prompt-swap"), MethodConfig("sae", k_trans=2, multiplier=1.0, blocks=[MID]),
               MethodConfig("sae", k_trans=2, multiplier=2.0, blocks=[MID]),
               MethodConfig("test-fails-on-delete")]
    cfg = RunConfig(model="random", configs=configs)
    runner = Runner(cfg, tmp_path, model=random_model(), saes=random_saes(), suite=tasks, progress=False)
    counts = runner.run()
    assert counts == {"done": 7, "already_done": 0, "failed": 1}
    done, failed = load_results(tmp_path)
    assert len(done) == 7 and failed[0]["task"] == tasks.tasks[1].id and "broken on purpose" in failed[0]["error"]
    assert {r["label"] for r in done} == {"prompt-swap", "sae@" + MID, "test-fails-on-delete"}

    again = Runner(cfg, tmp_path, model=random_model(), saes=random_saes(), suite=tasks, progress=False).run()
    assert again["done"] == 0 and again["already_done"] == 7 and again["failed"] == 1  # only the failure retried

    report = write_report(tmp_path)
    for name in ("categories.md", "categories.csv", "headline.md", "blocks.md", "blocks.csv", "tradeoff.png",
                 "tradeoff.html", "report.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert report["failed"] and "change shape" in (tmp_path / "categories.md").read_text()
    blocks = [r for r in report["blocks"] if r["method"] == "sae@" + MID]
    assert blocks and all(r[MID] == 1.0 for r in blocks)
    assert len(report["curves"]["sae@" + MID]) == 2


def test_runner_rejects_bad_configurations_before_generating(tmp_path):
    with pytest.raises(MethodError, match="k_trans=999 is larger"):
        Runner(RunConfig(configs=[MethodConfig("sae", k_trans=999)]), tmp_path, model=random_model(),
               saes=random_saes(), suite=few_tasks(1), progress=False)
    with pytest.raises(MethodError, match="needs SAEs"):
        Runner(RunConfig(configs=[MethodConfig("sae")]), tmp_path, model=random_model(), suite=few_tasks(1))
    assert not (tmp_path / "results").exists()


def test_cli_reports_bad_input_without_a_traceback(capsys, tmp_path):
    from riebench.__main__ import main

    assert main(["run", "--method", "sae", "--out", str(tmp_path), "--category", "change hat"]) == 2
    err = capsys.readouterr().err
    assert "unknown category 'change hat'" in err and "Traceback" not in err
    assert main(["tasks", "--suite", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.json")]) == 2
    assert "no task file" in capsys.readouterr().err


@pytest.mark.skipif(not (WEIGHTS_DIR / "t2i" / "model_index.json").exists(),
                    reason="the embedded toy model's weights are not committed yet")
def test_prompt_swap_reference_on_the_toy_model_mostly_succeeds(toy_t2i, tmp_path):
    tasks = suite().select(["change background", "change colour", "change shape", "move object"], 2)
    runner = Runner(RunConfig(configs=[MethodConfig("prompt-swap")]), tmp_path, model=toy_t2i, suite=tasks,
                    progress=False)
    assert runner.run()["failed"] == 0
    done, _ = load_results(tmp_path)
    success = np.mean([r["metrics"]["success"] for r in done])
    assert success >= 0.75, [(r["task"], r["metrics"]["success"]) for r in done]


@pytest.mark.skipif(not (WEIGHTS_DIR / "t2i" / "model_index.json").exists()
                    or not (Path(__file__).resolve().parents[1] / "saes" / "pretrained" / "toy" / "report.json").exists(),
                    reason="needs the embedded toy model and its shipped SAEs")
def test_sae_transport_changes_colour_through_the_block_that_draws_it_and_not_through_sdxls_four(toy_t2i, tmp_path):
    """The per-block finding (docs/experiments/riebench.md), on 8 colour tasks: transported features edit the colour from
    up_blocks.1.attentions.2 (preserving the rest) and do nothing from SDXL's four blocks."""
    colour_block = "up_blocks.1.attentions.2"
    configs = [MethodConfig("sae", 8, 1.0, [colour_block]), MethodConfig("sae", 8, 1.0, list(SDXL_BLOCKS))]
    runner = Runner(RunConfig(configs=configs, saes=str(Path(__file__).resolve().parents[1] / "saes" / "pretrained"
                                                         / "toy")),
                    tmp_path, model=toy_t2i, suite=suite().select(["change colour"], 8), progress=False)
    assert runner.run()["failed"] == 0
    done, _ = load_results(tmp_path)
    by_label = {label: [r["metrics"] for r in done if r["label"] == label] for label in {r["label"] for r in done}}
    colour, four = by_label["sae@" + colour_block], by_label["sae"]
    assert np.mean([m["success"] for m in colour]) >= 0.75 and np.mean([m["preservation"] for m in colour]) >= 0.85
    assert np.mean([m["success"] for m in four]) == 0


def test_headline_matrices_compare_methods_and_single_blocks_at_equal_preservation():
    from riebench.report import best_matrix, headline_table

    def row(method, category, success, preservation, k=2, m=1.0):  # as category_table writes it
        name, _, one_block = method.partition("@")
        return {"method": method, "k_trans": k, "m": m, "category": category, "success": success,
                "preservation": preservation, "method_name": name, "block": one_block or None,
                "reference": name == "prompt-swap"}

    block = "up_blocks.1.attentions.2"
    rows = [row("sae", "change colour", 0.9, 0.5),           # better, but below the preservation threshold
            row("sae", "change colour", 0.4, 0.95, k=8),
            row("activation-diff", "change colour", 0.7, 0.92, m=4.0),
            row(f"sae@{block}", "change colour", 0.8, 0.99),
            row(f"sae@{MID}", "change colour", 0.0, 1.0),
            row("prompt-swap", "change colour", 1.0, 0.6, k=0, m=0.0)]  # the reference is shown as it is
    headline = headline_table(rows, min_preservation=0.9)
    methods = best_matrix(headline, per_block=False)
    assert methods == [{"method": "activation-diff", "change colour": "0.70 (k 2, m 4)"},
                       {"method": "prompt-swap", "change colour": "1.00"},
                       {"method": "sae", "change colour": "0.40 (k 8, m 1)"}]
    blocks = best_matrix(headline, per_block=True)
    assert blocks == [{"method": "sae", "block": MID, "change colour": "0"},
                      {"method": "sae", "block": block, "change colour": "0.80 (k 2, m 1)"}]


def test_method_names_come_from_the_registry_with_their_variants():
    from riebench.methods import MethodError, method_names, parse_method_name

    # (other tests register methods of their own after these)
    assert method_names(edits_blocks=True)[:4] == ["sae", "sae-adaptive", "neurons", "activation-diff"]
    assert method_names(edits_blocks=False)[:1] == ["prompt-swap"] and "prompt-swap" not in method_names(True)
    assert parse_method_name("sae-adaptive") == ("sae", "adaptive") and parse_method_name("activation-diff") == (
        "activation-diff", "static")
    config = MethodConfig.named("sae-adaptive", k_trans=3, blocks=[MID])
    assert (config.variant, config.method_name, config.block, config.label) == (
        "adaptive", "sae-adaptive", MID, "sae-adaptive@" + MID)
    with pytest.raises(MethodError, match="neurons has the variant"):  # was accepted and ignored
        MethodConfig("neurons", variant="adaptive")
    with pytest.raises(MethodError, match="the methods are: prompt-swap, sae, sae-adaptive"):
        parse_method_name("sae-fast")


def test_labels_name_one_block_in_full_and_several_by_short_names():
    assert MethodConfig("sae", blocks=[MID]).label == "sae@" + MID
    six = ["down_blocks.2.attentions.1", MID, "up_blocks.0.attentions.0", "up_blocks.0.attentions.1",
           "up_blocks.1.attentions.1", "up_blocks.1.attentions.2"]
    assert MethodConfig("sae", blocks=six).label == "sae@down2.1+mid+up0.0+up0.1+up1.1+up1.2"
    assert MethodConfig("neurons", blocks=six[:4]).label == "neurons"  # SDXL's four


def test_pareto_front_keeps_the_configurations_nothing_beats_on_both_axes():
    from riebench.report import pareto_front

    points = [{"preservation": 1.0, "success": 0.0}, {"preservation": 0.95, "success": 0.5},
              {"preservation": 0.9, "success": 0.4},   # beaten by the 0.95 / 0.5 point
              {"preservation": 0.8, "success": 0.9}, {"preservation": 0.7, "success": 0.9}]  # tie: the better kept
    assert [(p["preservation"], p["success"]) for p in pareto_front(points)] == [(1.0, 0.0), (0.95, 0.5), (0.8, 0.9)]


TRADEOFF_CURVES = {  # a long method label (the UI's six-block SAE run) and points on the axes' ends
    "sae@down2.1+mid+up0.0+up0.1+up1.1+up1.2": [
        {"k_trans": 8, "m": 1.0, "success": 0.5, "preservation": 1.0, "block": None},
        {"k_trans": 32, "m": 2.0, "success": 1.0, "preservation": 0.8, "block": None}],
    "prompt-swap": [{"k_trans": 0, "m": 1.0, "success": 1.0, "preservation": 0.0, "block": None}]}


def test_the_interactive_tradeoff_plot_keeps_its_legend_below_and_draws_points_at_0_and_1_whole():
    """Issue 21: the legend on the right squeezed the data area, and points at preservation 1 were cut in half
    by the axis ending at 1.02."""
    from riebench.report import tradeoff_figure

    layout = tradeoff_figure(TRADEOFF_CURVES).layout
    assert layout.legend.orientation == "h" and layout.legend.y < 0 and layout.legend.yanchor == "top"
    for axis in (layout.xaxis, layout.yaxis):
        low, high = axis.range
        assert low <= -0.05 and high >= 1.05  # an 8-14 px marker at 0 or 1 stays inside the data area


def test_the_tradeoff_png_keeps_its_legend_below_the_axes_and_draws_points_at_0_and_1_whole():
    import matplotlib.pyplot as plt

    from riebench.report import tradeoff_matplotlib

    fig = tradeoff_matplotlib(TRADEOFF_CURVES)
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.y1 <= axes.y0  # below the data area, not over it
        for low, high in (ax.get_xlim(), ax.get_ylim()):
            assert low <= -0.05 and high >= 1.05
    finally:
        plt.close(fig)


def test_a_new_shapes_category_is_one_registry_entry_and_leaves_the_other_categories_tasks_unchanged(monkeypatch):
    from zoo import shapes as world
    from riebench import categories
    from riebench.metrics import edit_success

    before = shapes_suite(ShapesSuiteConfig(per_category=3)).tasks

    def shrink(d):  # the object becomes small; any other size stays as it was
        p = d.obj.position
        return world.replace_object(d.original, p, size="small"), p, p, ["size"]

    monkeypatch.setitem(categories.SHAPES_CATEGORY_REGISTRY, "make small", categories.ShapesCategory(
        "make small", "change content", shrink, lambda o, t, p, q: f"make the object at {p} small",
        lambda target, reading, p, q, attributes: reading.at(q) is not None and reading.at(q).size == "small"))
    assert "make small" in SHAPES_CATEGORIES
    after = shapes_suite(ShapesSuiteConfig(per_category=3)).tasks
    assert [t.to_dict() for t in after[:len(before)]] == [t.to_dict() for t in before]
    new = [t for t in after if t.category == "make small"]
    assert len(new) == 3 and all(t.editing_instruction.startswith("make the object at") for t in new)
    target = new[0].scenes()[1]
    reading = world.AttributeProbe().read(world.render(target))
    assert edit_success(new[0], reading) == 1.0
