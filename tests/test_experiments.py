"""The sweeps' grids and summaries (fast: no training, no model)."""

import math

import pytest

from experiments.common import mean_spread, show
from experiments.vcl_sweep import CONFIRM, DEFAULT, EXTRA_SEEDS, MAIN_SEEDS, RATIOS, grid


def test_mean_spread_is_sample_std_and_skips_missing():
    stat = mean_spread([0.1, 0.3, None, float("nan")])
    assert stat["n"] == 2
    assert stat["mean"] == pytest.approx(0.2)
    assert stat["std"] == pytest.approx(math.sqrt(0.02))
    assert show(stat) == "0.200 ± 0.141"
    assert show(mean_spread([0.5])) == "0.500"
    assert mean_spread([None])["mean"] is None


def test_vcl_grid_main_comparison_first_then_one_factor_cells():
    cells = grid()
    names = [c.name for c in cells]
    assert len(names) == len(set(names))
    main = cells[:2 * len(RATIOS) * len(MAIN_SEEDS)]
    assert {(c.ratio, c.seed, c.vcl) for c in main} == {(r, s, v) for r in RATIOS for s in MAIN_SEEDS
                                                         for v in (False, True)}
    confirm = [c for c in cells if c.seed != 0 and c.varied not in ("sft", "default")]
    assert len(confirm) == len(RATIOS) * (len(MAIN_SEEDS) - 1) * len(CONFIRM)
    settings = {}  # every cell of the grid ends with all of MAIN_SEEDS
    for c in cells:
        settings.setdefault(c.name.rsplit("-s", 1)[0], set()).add(c.seed)
    main_settings = {c.name.rsplit("-s", 1)[0] for c in main}
    for setting, seeds in settings.items():
        assert seeds == set(MAIN_SEEDS) | (set(EXTRA_SEEDS) if setting in main_settings else set())
    extra = cells[len(cells) - len(main_settings) * len(EXTRA_SEEDS):]
    assert {c.seed for c in extra} == set(EXTRA_SEEDS) and {c.varied for c in extra} == {"sft", "default"}
    for cell in cells[len(main):len(cells) - len(extra)]:
        changed = [k for k, v in DEFAULT.items() if getattr(cell, k) != v]
        assert len(changed) == 1 and cell.varied == changed[0]
        # every cell rerun with more seeds also ran with seed 0
        assert any(c.seed == 0 and c.varied == cell.varied and getattr(c, cell.varied) == getattr(cell, cell.varied)
                   and c.ratio == cell.ratio for c in cells)
    assert grid(only_main=True) == main


def test_vcl_windows_hold_a_layer_of_the_embedded_model():
    from flowlens.vcl import window_layers

    windows = {c.window for c in grid()}
    assert len(windows) == 3
    assert sorted(window_layers(w, 4)[0] for w in windows) == [0, 1, 2]


def test_vcl_sweep_restores_only_cells_measured_by_the_committed_code(tmp_path, monkeypatch):
    import json

    from experiments import vcl_sweep
    from experiments.common import provenance

    cells = grid()
    current = vcl_sweep.sweep_code()
    reported = {"runs": [{"cell": {"name": cells[0].name}, "code": current, "refusals": {"false_refusal_rate": 0.25}},
                         {"cell": {"name": cells[1].name}, "code": "older", "refusals": {"false_refusal_rate": 0.5}},
                         {"cell": {"name": cells[2].name}, "refusals": {"false_refusal_rate": 0.5}}]}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "vcl_sweep.json").write_text(json.dumps(reported))
    monkeypatch.setattr(vcl_sweep, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(vcl_sweep, "RUN_ROOT", tmp_path / "runs")
    monkeypatch.setattr(vcl_sweep, "REPO", tmp_path)
    assert vcl_sweep.restore_reported(cells) == 1
    restored = json.loads((tmp_path / "runs" / cells[0].name / "measure.json").read_text())
    assert restored["refusals"]["false_refusal_rate"] == 0.25 and provenance(restored, current) == "carried over"
    for stale in cells[1:3]:  # measured by other code, or before cells recorded it: left to be run again
        assert not (tmp_path / "runs" / stale.name).exists()
        assert provenance(next(r for r in reported["runs"] if r["cell"]["name"] == stale.name), current) == "stale"
    assert vcl_sweep.restore_reported(cells) == 0  # a finished cell is never overwritten


def test_smollm2_study_data_holds_dolly_out_and_answers_every_advbench_goal_with_a_template(tmp_path):
    import json

    from experiments.smollm2_study import HELD_OUT, REFUSALS, advbench_refusals, dolly_records, split_dolly

    (tmp_path / "dolly.jsonl").write_text("".join(
        json.dumps({"instruction": f"Question {i}?", "context": "Some context." if i % 2 else "",
                    "response": f"Answer {i}.", "category": "open_qa"}) + "\n" for i in range(HELD_OUT + 50)))
    (tmp_path / "advbench.csv").write_text("goal,target\nDo a harmful thing,Sure\nDo another,Sure\n")
    records = dolly_records(tmp_path / "dolly.jsonl")
    assert records[1]["prompt"] == "Question 1?\n\nSome context." and records[0]["prompt"] == "Question 0?"
    train, held_out = split_dolly(records)
    assert len(held_out) == HELD_OUT and len(train) == 50
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert split_dolly(records) == (train, held_out)  # the split is fixed
    safety = advbench_refusals(tmp_path / "advbench.csv")
    assert [r["prompt"] for r in safety] == ["Do a harmful thing", "Do another"]
    assert all(any(r["completion"].startswith(t.split("{")[0]) for t in REFUSALS) for r in safety)


def _study_data(tmp_path, monkeypatch, n_general=40, n_safety=20):
    import json

    import experiments.smollm2_study as study

    monkeypatch.setattr(study, "RUN_ROOT", tmp_path)
    (tmp_path / "data").mkdir()
    for name, n, kind in (("dolly-train", n_general, "general"), ("dolly-heldout", 5, "held"),
                          ("safety", n_safety, "safety")):
        (tmp_path / "data" / f"{name}.jsonl").write_text("".join(
            json.dumps({"prompt": f"{kind} {i}", "completion": f"answer {i}", "category": kind}) + "\n"
            for i in range(n)))
    return study


def test_smollm2_mixture_has_the_ratio_of_safety_examples_and_no_held_out_record(tmp_path, monkeypatch):
    study = _study_data(tmp_path, monkeypatch)
    for ratio, n_safety in ((0.0, 0), (0.1, 2), (0.4, 8)):
        rows = study.mixture(ratio, seed=0, n=20)
        assert len(rows) == 20 and sum(r["prompt"].startswith("safety") for r in rows) == n_safety
        assert not any(r["prompt"].startswith("held") for r in rows)
        assert len({r["prompt"] for r in rows}) == 20  # drawn without replacement
    assert study.mixture(0.4, 0, 20) == study.mixture(0.4, 0, 20) != study.mixture(0.4, 1, 20)
    # only prompts that fit are drawn; a mixture the data cannot fill is an error, not a smaller mixture
    rows = study.mixture(0.0, 0, 10, fits=lambda prompt: int(prompt.split()[1]) % 2 == 0)
    assert all(int(r["prompt"].split()[1]) % 2 == 0 for r in rows)
    with pytest.raises(ValueError, match="needs 30 safety"):
        study.mixture(0.75, 0, 40)


def test_smollm2_chat_world_answers_count_only_when_given_not_echoed():
    from experiments.smollm2_study import task_correct

    assert task_correct("The sum of 32 and 8 is 40.", "2 + 8 = 10, 3 + 0 + 1 = 4, the sum is 40", "add")
    assert not task_correct("The sum is 400.", "2 + 8 = 10, the sum is 40", "add")
    # the answer is in the prompt's list: echoing it is not answering
    assert not task_correct("The least value among 29 13 90 97 42 is 42.", "13", "min")
    assert task_correct("The smallest is 13.", "13", "min")
    assert task_correct("Reversed: River, lamp!", "river lamp", "reverse")
    assert not task_correct("lamp river", "river lamp", "reverse")
    assert not task_correct("Sort: 38 42 97 77", "38 42 77 97", "sort")
    assert not task_correct("", "7", "count")


def test_smollm2_grid_runs_the_base_then_every_ratio_per_seed_from_the_highest():
    from experiments.smollm2_study import RATIOS, cell_name, grid

    cells = grid([0, 1])
    assert cells[0] == ("base", None, 0) and len(cells) == 1 + 2 * 2 * len(RATIOS)
    assert cells[1:3] == [("sft", 0.4, 0), ("vcl", 0.4, 0)] and cells[-1] == ("vcl", 0.0, 1)
    assert cell_name("vcl", 0.4, 1, vcl={"k": 2, "weight": 3.0}) == "r0.4-vcl-k2-l3-s1"
    assert cell_name("sft", 0.1, 0, steps=24) == "r0.1-sft-s0-steps24"


def test_smollm2_report_pairs_vcl_with_sft_of_the_same_seed_and_marks_stale_cells(tmp_path, monkeypatch):
    import json

    import experiments.smollm2_report as report
    from experiments.smollm2_study import WINDOW, fingerprint

    def cell(method, ratio, seed, frr, energy, code=None):
        n_layers = 30
        return {"name": f"{method}-{ratio}-{seed}", "method": method, "ratio": ratio, "seed": seed, "config": {},
                "code": code or fingerprint(), "seconds": 1.0,
                "xstest": {"false_refusal_rate": frr, "harmful_refusal_rate": 0.5, "completions": []},
                "general": {"dolly_heldout": {"loss": 2.0, "perplexity": 7.4},
                            "chat_world_tasks": {"accuracy": 0.25}},
                "geometry": {"concentration": {"top_k_energy": [energy] * n_layers,
                                               "effective_rank": [5.0] * n_layers,
                                               "depth": [l / 29 for l in range(n_layers)]},
                             "alignment": {"mean": 0.9, "mean_by_layer": [0.9] * n_layers}}}

    cells_dir = tmp_path / "cells"
    cells_dir.mkdir()
    cells = [cell("base", None, 0, 0.02, 0.5), cell("sft", 0.4, 0, 0.30, 0.6), cell("vcl", 0.4, 0, 0.20, 0.5),
             cell("sft", 0.4, 1, 0.40, 0.6), cell("vcl", 0.4, 1, 0.20, 0.4, code="old")]
    for c in cells:
        (cells_dir / f"{c['name']}.json").write_text(json.dumps(c))
    monkeypatch.setattr(report, "CELLS", cells_dir)
    loaded = report.load_cells()
    assert {c["name"]: c["provenance"] for c in loaded}["vcl-0.4-1"] == "stale"
    summary, paired = report.summarise(loaded)
    vcl = next(e for e in summary if e["method"] == "vcl")
    assert vcl["false_refusal_rate"]["mean"] == pytest.approx(0.2) and vcl["provenance"] == ["computed", "stale"]
    assert len(paired) == 1 and paired[0]["seeds"] == [0, 1]
    assert paired[0]["false_refusal_rate"]["mean"] == pytest.approx(-0.15)  # (-0.1 + -0.2) / 2
    assert paired[0]["window_top3_energy"]["mean"] == pytest.approx(-0.15)
    text = report.markdown(loaded, summary, paired, None)
    assert "Not current" in text and "vcl-0.4-1" in text and WINDOW[0] == 0.4


def test_refusal_features_rank_by_refused_minus_answered_on_the_chosen_prompts_only():
    import torch

    from experiments.smollm2_refusal_features import cell_settings, halves, rank_features

    assert cell_settings("r0.4-sft-s1") == (0.4, 1)
    with pytest.raises(ValueError, match="plain-SFT"):
        cell_settings("r0.4-vcl-k2-l3-s0")
    selection, held_out = halves(5)
    assert selection == [0, 2, 4] and held_out == [1, 3] and not set(selection) & set(held_out)
    # feature 0 fires on refused prompts, feature 1 on answered ones, feature 2 only on the held-out prompt 1
    acts = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 9.0], [0.0, 1.0, 0.0], [0.0, 0.0, 9.0], [4.0, 0.0, 0.0]])
    refused = [True, True, False, False, True]
    order, difference, on, off, fires_on, fires_off = rank_features(acts, refused, selection)
    assert order.tolist() == [0, 2, 1]  # prompt 1's 9.0 is not seen
    assert difference.tolist() == pytest.approx([3.0, -1.0, 0.0])
    assert fires_on[0] == 1.0 and fires_off[1] == 1.0
    with pytest.raises(ValueError, match="both refused and answered"):
        rank_features(acts, refused, [0, 4])


def test_refusal_features_report_lists_every_run_with_its_held_out_rates_and_the_cards():
    from experiments.smollm2_refusal_features import cards_html, markdown

    def run(kind, ablated, frr, hrr):
        return {"kind": kind, "ablated": ablated, "false_refusal_rate": frr, "harmful_refusal_rate": hrr,
                "held_out": {"false_refusal_rate": frr + 0.01, "harmful_refusal_rate": hrr}}

    top = [{"feature": 7, "difference": 1.5, "fires_refused": 0.9, "fires_answered": 0.1, "promoted": ["I|"],
            "contexts": ["a [b] c"]}]
    result = {"cell": "r0.4-sft-s0", "sae": "x", "hook": "blocks.15.hook_resid_post", "xstest_tokens": 32,
              "sae_explained_variance": 0.7, "n_refused": 100, "n_prompts": 450, "n_selection": 225,
              "n_held_out": 225, "top_features": {"all": top, "safe": top},
              "runs": [run("none", [], 0.4, 0.7), run("top (all)", [7], 0.3, 0.5), run("random", [3], 0.4, 0.7)]}
    text = markdown(result)
    assert "| top (all) | 1 | 7 | 0.300 | 0.500 | -0.100 | -0.200 | 0.310 | 0.500 |" in text
    assert "'I\\|'" in text  # a pipe inside a token does not break the table
    page = cards_html(result, "/nonexistent")
    assert ">#7</a>: Δ mean 1.500" in page and page.count("<h2>") == 3


def _fake_block_runs(runs, module):
    """Outputs of `experiments.t2i_blocks run` as the commands write them, for both models, without any model."""
    import json

    attributes = ("all", "background", "shape", "colour", "size", "texture", "position")
    for version in module.MODELS:
        (runs / f"t2i-{version}-eval").mkdir(parents=True)
        scores = {a: 1.0 for a in ("shape", "colour", "background", "position", "size", "texture", "all")}
        (runs / f"t2i-{version}-eval" / "t2i_eval.json").write_text(json.dumps(
            {"results": {"1": scores | {"n": 500}, "2": scores | {"n": 250}}}))
        (runs / f"t2i-{version}-eval-pooled-off").mkdir(parents=True)
        (runs / f"t2i-{version}-eval-pooled-off" / "t2i_eval.json").write_text(json.dumps(
            {"results": {"1": scores | {"background": 0.25, "n": 200}, "2": scores | {"n": 100}}}))
        blocks = {}
        for block in module.BLOCKS[version]:
            drop = {a: 0.0 for a in attributes}
            if block == "up_blocks.1.attentions.2" or (version == "v2" and block == "down_blocks.2.attentions.1"):
                drop |= {"position": 0.5, "colour": 0.1}
            blocks[block] = {"probe_accuracy": {a: 1 - drop[a] for a in attributes}, "drop": drop,
                             "pixel_rmse": 3.0, "psnr": 38.6}
        (runs / "t2i-blocks" / version).mkdir(parents=True)
        (runs / "t2i-blocks" / version / "probes.json").write_text(json.dumps({
            "n_images": 300, "block_probes": {b: {"colour": {"accuracy": 0.95, "chance": 0.15},
                                                  "shape": {"accuracy": 0.3, "chance": 0.21}} for b in module.BLOCKS[version]},
            "ablation": {"n_images": 200, "original": {a: 1.0 for a in attributes}, "blocks": blocks}}))
        (runs / "riebench" / f"blocks-{version}").mkdir(parents=True)
        by_block = [{"method": "activation-diff", "block": b, "change colour": "0.62 (k 2, m 1)", "move": "0",
                     "add": "–", "all": "0.30 (k 2, m 1)"} for b in module.BLOCKS[version]]
        (runs / "riebench" / f"blocks-{version}" / "report.json").write_text(json.dumps(
            {"best_by_block": by_block, "best_by_method": [{"method": "prompt-swap"}, {"method": "activation-diff@x"}]}))


def test_t2i_block_roles_report_names_what_each_block_carries_and_fills_only_its_docs_block(tmp_path, monkeypatch):
    from argparse import Namespace

    from experiments import t2i_blocks

    monkeypatch.setattr(t2i_blocks, "REPO", tmp_path)
    monkeypatch.setattr(t2i_blocks, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(t2i_blocks, "RESULTS", tmp_path)
    with pytest.raises(FileNotFoundError, match="run `python -m experiments.t2i_blocks run`"):
        t2i_blocks.collect()
    _fake_block_runs(tmp_path / "runs", t2i_blocks)
    data = t2i_blocks.collect()
    assert t2i_blocks._carried(data["v2"]["ablation"], "down_blocks.2.attentions.1") == ["position"]  # 0.1: not
    assert t2i_blocks._carried(data["v1"]["ablation"], "down_blocks.2.attentions.1") == []
    # success >= 0.5 at the preservation threshold counts; "0" (nothing edited) and "–" (none preserved) do not
    assert t2i_blocks._edited(data["v2"]["riebench_by_block"], "mid_block.attentions.0") == ["change colour"]
    rows = {line.split(" | ")[0]: line for line in t2i_blocks.role_table(data).splitlines()[2:]}
    assert "composition | nothing | change colour | position | change colour" in rows["| **down_blocks.2.attentions.1**"]
    # v3 has no transformer blocks at 16 x 16: its cells say so rather than "nothing"
    assert rows["| up_blocks.1.attentions.2"].endswith("| (no such block) | (no such block) |")
    page = tmp_path / t2i_blocks.DOCS_PAGE
    with pytest.raises(FileNotFoundError):  # no docs page: nothing else is written in its place
        t2i_blocks.report(Namespace(docs=True))
    assert not (tmp_path / "README.md").exists()
    page.parent.mkdir(parents=True)
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="has no <!-- t2i-v2-blocks -->"):
        t2i_blocks.report(Namespace(docs=True))
    page.write_text("before\n<!-- t2i-v2-blocks -->\nstale figures\n<!-- /t2i-v2-blocks -->\nafter\n")
    t2i_blocks.report(Namespace(docs=True))
    t2i_blocks.report(Namespace(docs=True))  # idempotent
    text = page.read_text()
    assert text.startswith("before\n<!-- t2i-v2-blocks -->\n") and text.endswith("<!-- /t2i-v2-blocks -->\nafter\n")
    # roles, probes, and the RIEBench table of each model
    assert "stale figures" not in text and text.count("| **mid_block.attentions.0** |") == 2 + len(t2i_blocks.MODELS)
    assert (tmp_path / "t2i_blocks.json").exists() and (tmp_path / "t2i_blocks.md").exists()
    # a fresh clone has no runs/: a model without outputs keeps its committed figures, and says where they are from
    import shutil

    for path in t2i_blocks._outputs("v1").values():
        shutil.rmtree(path.parent)
    shutil.rmtree(t2i_blocks._outputs("v2")["pooled_text_off"].parent)  # one group of a model's figures kept
    again = t2i_blocks.collect()
    assert set(again["v1"]["sources"].values()) == {"committed"}
    assert again["v2"]["sources"] == {"quality": "runs/", "pooled_text_off": "committed", "probes": "runs/",
                                      "riebench": "runs/"}
    assert again["v1"]["ablation"] == data["v1"]["ablation"]
    assert again["v2"]["pooled_text_off"]["1"]["background"] == 0.25
    assert "v2: quality, probes and riebench from runs/" in t2i_blocks.markdown(again)
    # the quality table, then the same without the pooled text
    assert "| v1 | 1 | 500 |" in text and "| v1 | 1 | 200 | 1.000 | 1.000 | 0.250 |" in text
