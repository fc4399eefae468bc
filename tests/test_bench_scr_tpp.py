"""SAEBench's SCR and TPP evals (saes/bench/scr_tpp.py) on the toy chat model's shipped SAE, with the chat world's
task types as classes, and their parity with SAEBench 0.6.0's own functions on the same SAE, activations and
probes (agreement within 1e-4 relative; the same probe accuracies).

SAEBench's evals/scr_and_tpp/main.py does not import on this stack (its sae_selection_utils needs `tabulate`), so
its functions are read from the installed file and run by themselves; sparse_probing/probe_training.py and
dataset_info.py import and are called as shipped."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from saes.bench import scr_tpp as st
from saes.sae import SAE

ROOT = Path(__file__).resolve().parents[1]
TOY_SAE = ROOT / "saes/pretrained/toy-chat/blocks.1.hook_resid_post"
HOOK = "blocks.1.hook_resid_post"
TASKS = ("add", "copy", "reverse", "max", "fact")
WIDTH = 5  # tokens per text in the parity data: every text fills them, so nothing is padded


@pytest.fixture(scope="module")
def toy():
    from interp.models.lm import load_lm

    torch.set_num_threads(1)
    return load_lm("toy-chat"), SAE.load(TOY_SAE, dtype="float32")


def chat_records(n_per_task: int, seed: int = 0) -> list[tuple[str, str]]:
    from zoo.chat.world import general_example, knowledge_base

    rng, kb = random.Random(seed), knowledge_base()
    return [(general_example(rng, "train", kb, task)["prompt"], task) for task in TASKS for _ in range(n_per_task)]


def saebench_main():
    """The functions of SAEBench's scr_and_tpp/main.py, compiled from the installed file (see the docstring)."""
    import einops
    import sae_bench.evals.scr_and_tpp as package
    import sae_bench.evals.sparse_probing.probe_training as probe_training
    import sae_bench.sae_bench_utils.dataset_info as dataset_info

    tree = ast.parse((Path(next(iter(package.__path__))) / "main.py").read_text())
    wanted = {"get_effects_per_class_precomputed_acts", "select_top_n_features", "ablated_precomputed_activations",
              "get_probe_test_accuracy", "get_scr_probe_test_accuracy", "perform_feature_ablations",
              "get_scr_plotting_dict", "create_tpp_plotting_dict"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in body} == wanted
    namespace = {"torch": torch, "einops": einops, "probe_training": probe_training, "dataset_info": dataset_info,
                 "SAE": object}
    exec(compile(ast.Module(body=body, type_ignores=[]), "sae_bench/evals/scr_and_tpp/main.py", "exec"), namespace)
    return namespace


class SAEBenchSAE:
    def __init__(self, sae):
        self.sae, self.W_dec = sae, sae.W_dec

    def encode(self, x):
        return self.sae.encode(x)

    def decode(self, f):
        return self.sae.decode(f)


def as_saebench_probe(probe):
    from sae_bench.evals.sparse_probing.probe_training import Probe

    theirs = Probe(probe.net.in_features, torch.float32)
    theirs.load_state_dict(probe.state_dict())
    return theirs


def close(a, b, rtol=1e-4, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def scr_sets(toy):
    """SCR's six sets (add vs copy, the planted lower-casing), as (train, test) token activations, every text
    cut to WIDTH tokens after the start token and the start position dropped: no position is masked."""
    lm, _ = toy
    split = st._by_class(chat_records(60), random.Random(1))
    out = []
    for part, size in ((0, 40), (1, 8)):
        sets = st.spurious_sets(split["add"][part], split["copy"][part], size // 4, 42, "train")
        out.append({k: st.token_activations(lm, HOOK, v, WIDTH + 1, 64)[:, 1:] for k, v in sets.items()})
    assert all(x.shape[1] == WIDTH and (x.sum(-1) != 0).all() for s in out for x in s.values())
    return out


def test_spurious_sets_follow_saebench_quadrants():
    a = [f"Alpha text {i}" for i in range(30)]
    b = [f"Beta text {i}" for i in range(30)]
    sets = st.spurious_sets(a, b, 4, 0, "train")
    assert {len(v) for v in sets.values()} == {8}
    lower = str.islower
    assert all(t.startswith("Alpha") for t in sets["male_professor / female_nurse"])       # A, as written
    assert all(t.startswith("beta") for t in sets["female_nurse_data_only"])                # B, lower-cased
    assert sorted(lower(t[0]) for t in sets["professor / nurse"]) == [False] * 4 + [True] * 4  # A, both casings
    assert all(t.lower().startswith("beta") for t in sets["nurse_data_only"])
    assert all(not lower(t[0]) for t in sets["male / female"])                              # as written, A and B
    assert {t.split()[0] for t in sets["male / female"]} == {"Alpha", "Beta"}
    assert all(lower(t[0]) for t in sets["female_data_only"])
    with pytest.raises(st.ScrTppError, match="per quadrant"):
        st.spurious_sets(a, b, 10, 0, "train")


def test_probes_and_accuracies_match_saebench(scr_sets):
    from sae_bench.evals.sparse_probing.probe_training import train_probe_on_activations

    train, test = ({k: st.meaned(v) for k, v in s.items()} for s in scr_sets)
    config = st.ScrTppConfig(probe_epochs=3)
    torch.manual_seed(5)
    theirs, _ = train_probe_on_activations(train, test, select_top_k=None, use_sklearn=False, batch_size=16,
                                           epochs=3, lr=1e-3, perform_scr=True, early_stopping_patience=20,
                                           l1_penalty=1e-3)
    torch.manual_seed(5)
    ours = st.train_probes(train, test, config)
    for name in train:
        close(ours[name].net.weight.detach(), theirs[name].net.weight.detach())
    main = saebench_main()
    torch.manual_seed(9)
    their_acc = main["get_probe_test_accuracy"](theirs, list(st.PAIRED_CLASS_KEYS), test, 500, True)
    torch.manual_seed(9)
    our_acc = st.test_accuracies(ours, list(st.PAIRED_CLASS_KEYS), test, 500, True)
    assert our_acc.keys() == their_acc.keys() and len(our_acc) == 9
    close([our_acc[k] for k in our_acc], [their_acc[k] for k in our_acc])


@pytest.mark.parametrize("perform_scr", [True, False])
def test_effects_ablations_and_scores_match_saebench(toy, scr_sets, perform_scr):
    _, sae = toy
    train_BLD, test_BLD = scr_sets
    if not perform_scr:  # TPP reads the sets as plain classes
        train_BLD = {k: v for k, v in train_BLD.items() if k in st.PAIRED_CLASS_KEYS}
        test_BLD = {k: v for k, v in test_BLD.items() if k in st.PAIRED_CLASS_KEYS}
    main = saebench_main()
    classes = list(st.PAIRED_CLASS_KEYS)
    config = st.ScrTppConfig(probe_epochs=2, n_values=[2, 10, 50], perform_scr=perform_scr, sae_batch_size=7)
    torch.manual_seed(0)
    ours_probes = st.train_probes({k: st.meaned(v) for k, v in train_BLD.items()},
                                  {k: st.meaned(v) for k, v in test_BLD.items()}, config)
    probes = {k: as_saebench_probe(p) for k, p in ours_probes.items()}  # SAEBench type-checks its Probe class
    for name in classes:
        torch.manual_seed(1)
        theirs = main["get_effects_per_class_precomputed_acts"](SAEBenchSAE(sae), probes[name], name, train_BLD,
                                                                perform_scr, 7)
        torch.manual_seed(1)
        ours = st.latent_effects(sae, probes[name], name, train_BLD, perform_scr, 7)
        close(ours, theirs, atol=1e-7)
        for n in config.n_values:
            assert torch.equal(st.top_latents(ours, n), main["select_top_n_features"](ours, n, name))
    mask = st.top_latents(ours, 10)
    close(st.ablated_means(test_BLD[name], sae, mask, 7),
          main["ablated_precomputed_activations"](test_BLD[name], SAEBenchSAE(sae), mask, 7), atol=1e-5)

    effects = {}
    for name in classes:
        torch.manual_seed(2)
        effects[name] = st.latent_effects(sae, probes[name], name, train_BLD, perform_scr, 7)
    torch.manual_seed(3)
    theirs = main["perform_feature_ablations"](probes, SAEBenchSAE(sae), 7, test_BLD, effects, config.n_values,
                                               classes, 500, perform_scr)
    torch.manual_seed(3)
    ours = st.ablation_accuracies(probes, sae, test_BLD, effects, config, classes)
    assert ours == theirs
    torch.manual_seed(4)
    clean = st.test_accuracies(probes, classes, {k: st.meaned(v) for k, v in test_BLD.items()}, 500, perform_scr)
    if perform_scr:
        close(list(st.scr_scores(ours, clean).values()),
              list(main["get_scr_plotting_dict"](theirs, clean).values()))
        assert st.scr_scores(ours, clean).keys() == main["get_scr_plotting_dict"](theirs, clean).keys()
    else:
        mine, per_class = st.tpp_scores(ours, clean)
        their_overall, their_per_class = main["create_tpp_plotting_dict"](theirs, clean)
        assert mine == their_overall and per_class == their_per_class


def test_masked_positions_are_left_out_of_the_ablated_mean(toy):
    """The one departure from SAEBench (the docstring of ablated_means): a zeroed (masked) position adds nothing."""
    lm, sae = toy
    acts = st.token_activations(lm, HOOK, ["Copy these words: lamp river", "Sort: 11 10 40 65"], 16, 8)
    assert (acts[:, 0] == 0).all()  # the start token is masked
    everything = torch.zeros(sae.cfg.d_sae, dtype=torch.bool)
    everything[:] = True
    means = st.ablated_means(acts, sae, everything, 8)
    keep = acts.sum(-1) != 0
    # every latent ablated: what is left is decode(0) = b_dec plus each real token's SAE error, averaged over the
    # real tokens only (SAEBench would add b_dec - decode(f(0)) at every masked position too)
    errors = torch.zeros_like(acts)
    errors[keep] = sae.b_dec + acts[keep] - sae(acts[keep])
    close(means, errors.sum(1) / keep.sum(-1, keepdim=True), atol=1e-5)


def test_scr_and_tpp_end_to_end_on_the_chat_world(toy):
    lm, sae = toy
    records = chat_records(70)
    config = st.ScrTppConfig(model_name="toy-chat", train_set_size=40, test_set_size=16, probe_epochs=4,
                             n_values=[2, 20], column1_vals_lookup={"chat": [["add", "copy"]]},
                             tpp_classes=["add", "copy", "max"])
    metrics, details = st.run_scr(sae, lm, HOOK, records, config, dataset_name="chat")
    assert set(metrics["scr_metrics"]) >= {"scr_dir1_threshold_2", "scr_dir2_threshold_20"}
    assert [d["dataset_name"] for d in details] == ["chat_scr_add_copy_results"]
    assert all(np.isfinite(v) for v in metrics["scr_metrics"].values())
    tpp, details = st.run_tpp(sae, lm, HOOK, records, config, dataset_name="chat")
    values = tpp["tpp_metrics"]
    for n in (2, 20):
        close(values[f"tpp_threshold_{n}_total_metric"],
              values[f"tpp_threshold_{n}_intended_diff_only"] - values[f"tpp_threshold_{n}_unintended_diff_only"])
    # the chat world's task types are easy to tell apart: ablating 20 latents of a class's probe costs that probe
    # more accuracy than it costs the others
    assert values["tpp_threshold_20_intended_diff_only"] > values["tpp_threshold_20_unintended_diff_only"]


def test_bad_input_is_one_line(toy, tmp_path):
    lm, sae = toy
    one_class = tmp_path / "one.jsonl"
    one_class.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n')
    with pytest.raises(st.ScrTppError, match="fewer than two classes"):
        st.read_labelled(one_class)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a", "label": "x"}\nnot json\n')
    with pytest.raises(st.ScrTppError, match="broken.jsonl:2"):
        st.read_labelled(broken)
    records = chat_records(10)
    with pytest.raises(st.ScrTppError, match="no class 'nurse'"):
        st.run_scr(sae, lm, HOOK, records, st.ScrTppConfig(column1_vals_lookup={"d": [["add", "nurse"]]}),
                   dataset_name="d")
    with pytest.raises(st.ScrTppError, match="n_values"):
        st.run_tpp(sae, lm, HOOK, records, st.ScrTppConfig(n_values=[5000], tpp_classes=["add", "copy"]))
    with pytest.raises(st.ScrTppError, match="train_set_size"):
        st.run_tpp(sae, lm, HOOK, records, st.ScrTppConfig(train_set_size=0))
    wide = SAE.load(ROOT / "saes/pretrained/smollm2/blocks.15.hook_resid_post")
    with pytest.raises(st.ScrTppError, match="d_in=576"):
        st.run_tpp(wide, lm, HOOK, records, st.ScrTppConfig(tpp_classes=["add", "copy"]))


# ----------------------------------------------------------------------------- through `saes bench`


def _bench(args, capsys):
    from saes.__main__ import main

    code = main(["bench", *args])
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if "Loading weights" not in line and not line.startswith(("scr:", "tpp:", "absorption:"))]
    return code, err


def test_bench_cli_bad_input_is_one_line_nothing_written(tmp_path, capsys):
    one_class = tmp_path / "one.jsonl"
    one_class.write_text('{"text": "a", "label": "x"}\n')
    base = ["--sae", str(TOY_SAE), "--model", "toy-chat"]
    image_sae = ROOT / "saes/pretrained/toy/mid_block.attentions.0"
    cases = [([*base, "--evals", "scr"], "need --dataset"),
             ([*base, "--evals", "tpp", "--dataset", str(one_class)], "fewer than two classes"),
             ([*base, "--evals", "tpp", "--dataset", str(tmp_path / "missing.jsonl")], "no dataset file"),
             ([*base, "--evals", "scr", "--dataset", "chat_world_task", "--option", "n_values=[0]"], "n_values"),
             ([*base, "--evals", "scr", "--dataset", "chat_world_task", "--option", 'scr_pairs=[["add"]]'],
              "scr_pairs"),
             ([*base, "--evals", "absorption", "--option", "max_words=3"], "max_words"),
             ([*base, "--evals", "absorption", "--option", "max_k_value=999"], "max_k_value"),
             (["--sae", str(image_sae), "--model", "toy-chat", "--evals", "absorption"], "image-model SAE")]
    for args, expected in cases:
        out = tmp_path / "out"
        code, err = _bench([*args, "--out", str(out)], capsys)
        assert code == 2, args
        assert len(err) == 1 and err[0].startswith("error:") and expected in err[0], err
        assert not out.exists()


def test_bench_cli_writes_valid_tpp_json(tmp_path, capsys):
    import json

    from saes.bench.schema import validate

    out = tmp_path / "out"
    code, _ = _bench(["--sae", str(TOY_SAE), "--model", "toy-chat", "--evals", "tpp", "--dataset", "chat_world_task",
                      "--option", "n_values=[5]", "--option", "probe_epochs=3", "--option", "train_set_size=40",
                      "--option", "test_set_size=16", "--out", str(out)], capsys)
    assert code == 0
    result = json.loads((out / "tpp" / "interp-workbench_blocks.1.hook_resid_post_eval_results.json").read_text())
    validate(result)
    assert result["eval_type_id"] == "tpp" and result["eval_config"]["dataset_names"] == ["chat_world_task"]
    assert set(result["eval_result_metrics"]["tpp_metrics"]) == {
        "tpp_threshold_5_total_metric", "tpp_threshold_5_intended_diff_only", "tpp_threshold_5_unintended_diff_only"}
