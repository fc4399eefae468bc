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
