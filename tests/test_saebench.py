"""`saes bench` (saes/bench): SAEBench 0.6.0's metrics on the toy chat model's shipped SAE, checked against
SAEBench's own functions on the same SAE and tokens, and its JSON against the wheel's schemas."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from saes.bench.registry import BenchOptions
from saes.bench.schema import ENVELOPE_FIELDS, SchemaError, envelope, schemas, validate, write_result
from saes.sae import SAE

SAE_DIR = Path(__file__).resolve().parents[1] / "saes" / "pretrained" / "toy-chat" / "blocks.1.hook_resid_post"
HOOK = "blocks.1.hook_resid_post"
REL = 1e-4


def _need_sae_bench():
    pytest.importorskip("sae_bench", reason="sae-bench 0.6.0 is an anchor (requirements-anchors.txt)")


def _saebench_core():
    """sae_bench.evals.core.main; its module imports `tabulate` for printing SAE lists (sae_selection_utils), which
    this stack lacks and none of the metric functions calls: a stand-in that fails if called."""
    _need_sae_bench()
    if "tabulate" not in sys.modules:
        try:
            import tabulate  # noqa: F401
        except ImportError:
            stand_in = types.ModuleType("tabulate")

            def tabulate(*args, **kwargs):
                raise AssertionError("tabulate is not installed; SAEBench's metric functions do not use it")

            stand_in.tabulate = tabulate
            sys.modules["tabulate"] = stand_in
            try:
                import sae_bench.evals.core.main as core_main
            finally:  # only SAEBench's module keeps it (torch looks for tabulate too, and would find the stand-in)
                del sys.modules["tabulate"]
    import sae_bench.evals.core.main as core_main

    return core_main


@pytest.fixture(scope="module")
def tl_lm():
    from interp.models.lm import load_lm

    return load_lm("toy-chat", backend="transformer_lens")


@pytest.fixture(scope="module")
def sae():
    return SAE.load(SAE_DIR).eval()


def _packed_batches(lm, n_batches=2, rows=4, width=24):
    """SAEBench's token batches: the held-out documents' tokens (each ending in the eos token) packed into rows
    of `width`, each row led by the start token, `rows` rows a batch; no padding."""
    from interp.lm_text import start_token
    from saes.bench.evals.core import held_out_documents

    docs, _ = held_out_documents(BenchOptions(hook=HOOK, model_name="toy-chat"), lm.tokenizer)
    stream = [t for ids in lm.tokenizer(docs[:80], add_special_tokens=False)["input_ids"] for t in ids]
    start, _ = start_token(lm.tokenizer)
    body = width - 1
    need = n_batches * rows
    assert len(stream) >= need * body
    rows_ = torch.tensor([[start] + stream[i * body:(i + 1) * body] for i in range(need)])
    return [rows_[b * rows:(b + 1) * rows] for b in range(n_batches)]


class _Cfg:
    def __init__(self, sae):
        self.hook_name, self.hook_layer, self.hook_head_index = HOOK, 1, None
        self.d_sae, self.architecture_str = sae.cfg.d_sae, sae.cfg.architecture


class _SAEForSAEBench:
    """What SAEBench's core functions read of an SAE (sae_lens.SAE's names), over the project's SAE."""

    def __init__(self, sae):
        self.sae, self.cfg, self.device = sae, _Cfg(sae), torch.device("cpu")
        self.W_enc, self.W_dec, self.b_enc = sae.W_enc, sae.W_dec, sae.b_enc

    def encode(self, x):
        return self.sae.encode(x)

    def decode(self, z):
        return self.sae.decode(z)


class _Store:
    """SAEBench's ActivationsStore as its core functions use it: get_batch_tokens, reset_input_dataset."""

    def __init__(self, batches):
        self.batches, self.i = batches, 0

    def get_batch_tokens(self, n):
        batch = self.batches[self.i]
        assert batch.shape[0] == n
        self.i += 1
        return batch

    def reset_input_dataset(self):
        self.i = 0


def _close(ours, theirs, what):
    if isinstance(theirs, float) and math.isnan(theirs):
        assert math.isnan(ours), what
        return
    assert ours == pytest.approx(theirs, rel=REL, abs=1e-7), f"{what}: ours {ours}, SAEBench {theirs}"


def test_core_metrics_match_saebench_functions(tl_lm, sae):
    """Every core metric and per-feature detail against sae_bench.evals.core.main's own functions, run on the same
    TransformerLens model, SAE and token batches (with SAEBench's ignore_tokens: pad, eos, bos)."""
    from saes.bench.evals.core import compute_core, special_token_ids

    core_main = _saebench_core()
    batches = _packed_batches(tl_lm)
    special = special_token_ids(tl_lm.tokenizer)
    assert any(bool((b == tl_lm.tokenizer.eos_token_id).any()) for b in batches)  # the mask is exercised
    ours, feature, _ = compute_core(tl_lm, sae, HOOK, [(b, torch.ones_like(b)) for b in batches],
                                    exclude_special=True)

    adapter, store = _SAEForSAEBench(sae), _Store(batches)
    recon = core_main.get_downstream_reconstruction_metrics(
        adapter, tl_lm.model, store, compute_kl=True, compute_ce_loss=True, n_batches=len(batches),
        eval_batch_size_prompts=batches[0].shape[0], ignore_tokens=special,
        exclude_special_tokens_from_reconstruction=True)
    store.reset_input_dataset()
    sparsity, their_feature = core_main.get_sparsity_and_variance_metrics(
        adapter, tl_lm.model, store, n_batches=len(batches), compute_l2_norms=True, compute_sparsity_metrics=True,
        compute_variance_metrics=True, compute_featurewise_density_statistics=True,
        eval_batch_size_prompts=batches[0].shape[0], model_kwargs={}, ignore_tokens=special)
    their_feature |= core_main.get_featurewise_weight_based_metrics(adapter)
    misc = core_main.calculate_misc_metrics(their_feature)

    theirs = {**recon, **sparsity, **misc}
    flat = {k: v for category in ours.values() for k, v in category.items()}
    compared = 0
    for name, value in theirs.items():
        _close(flat[name], value, name)
        compared += 1
    assert compared == 24  # every scalar metric of SAEBench's core categories but the token counts
    for name, values in their_feature.items():
        for i, value in enumerate(values):
            _close(feature[name][i], value, f"{name}[{i}]")
    # `saes bench` runs the Hugging Face model: on the same batches it gives the same numbers as TransformerLens
    from interp.models.lm import load_lm

    hf_lm = load_lm("toy-chat")
    hf, _, _ = compute_core(hf_lm, sae, HOOK, [(b, torch.ones_like(b)) for b in batches], exclude_special=True)
    for category, values in ours.items():
        for name, value in values.items():
            assert hf[category][name] == pytest.approx(value, rel=1e-3, abs=1e-5), (name, hf[category][name], value)
    # a working SAE, not zeros (on 8 packed rows of 24 tokens CE is noise: zero ablation can even beat the clean
    # model there; the KL score is not)
    assert 0.5 < flat["kl_div_score"] <= 1 and flat["l0"] == pytest.approx(16.0)


def test_bench_core_writes_valid_saebench_json(tmp_path):
    """`saes bench --evals core` end to end on the shipped toy-chat SAE: one JSON, valid against the wheel's
    schema, with every per-feature detail and numbers that agree with the SAE's own shipped eval."""
    _need_sae_bench()
    from saes.__main__ import main

    assert main(["bench", "--sae", str(SAE_DIR), "--model", "toy-chat", "--evals", "core", "--out",
                 str(tmp_path), "--n-tokens", "600", "--batch-size", "16", "--threads", "1"]) == 0
    files = list(tmp_path.rglob("*.json"))
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "core/interp-workbench_blocks.1.hook_resid_post_eval_results.json"]
    result = json.loads(files[0].read_text())
    validate(result)
    assert list(result) == list(ENVELOPE_FIELDS)
    assert len(result["eval_result_details"]) == 1024
    metrics = result["eval_result_metrics"]
    assert metrics["sparsity"]["l0"] == pytest.approx(16.0)  # top-k with k = 16
    shipped = json.loads((SAE_DIR / "eval.json").read_text())
    assert result["eval_result_unstructured"]["textbook"]["explained_variance_1_minus_fvu"] == pytest.approx(
        shipped["explained_variance"], abs=0.03)


def test_schema_validation_rejects_broken_results():
    _need_sae_bench()
    assert {"core", "sparse_probing", "absorption_first_letter", "scr", "tpp"} <= set(schemas())
    good = envelope("core", {}, {}, [], {})
    with pytest.raises(SchemaError, match="model_behavior_preservation"):
        validate(good)  # the core schema requires every metric category
    with pytest.raises(SchemaError, match="no schema for eval type"):
        validate({**good, "eval_type_id": "nonsense"})
    with pytest.raises(SchemaError, match="lacks"):
        validate({k: v for k, v in good.items() if k != "eval_id"})


def test_writer_refuses_shipped_paths():
    from interp.shipped import ShippedFilesError

    target = SAE_DIR / "saebench" / "core.json"
    with pytest.raises(ShippedFilesError):
        write_result(target, envelope("core", {}, {}, [], {}))
    assert not target.exists()


def _bench(args, capsys):
    from saes.__main__ import main

    code = main(["bench", *args])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "Loading weights" not in line]
    return code, err


def test_bad_input_one_line_nothing_written(tmp_path, capsys):
    """An image SAE, a model without the SAE's hook, a mismatched d_in: one line each, nothing written."""
    image_sae = Path(__file__).resolve().parents[1] / "saes" / "pretrained" / "toy" / "mid_block.attentions.0"
    cases = [
        (["--sae", str(image_sae), "--model", "toy-chat", "--evals", "core"], "image-model SAE"),
        (["--sae", str(SAE_DIR), "--model", "toy-chat", "--evals", "nope"], "unknown eval type"),
        (["--sae", str(SAE_DIR), "--model", "toy-chat", "--evals", "core", "--option", "bogus=1"], "read by none"),
    ]
    # an SAE at a hook the model lacks, and one of another width
    sae = SAE.load(SAE_DIR)
    deep = tmp_path / "deep"
    sae.cfg.metadata = {**sae.cfg.metadata, "hook_name": "blocks.9.hook_resid_post"}
    sae.save(deep)
    cases.append((["--sae", str(deep), "--model", "toy-chat", "--evals", "core"], "no hook"))
    from saes.sae import SAEConfig

    narrow = tmp_path / "narrow"
    SAE(SAEConfig("topk", d_in=64, d_sae=128, k=4, metadata={"hook_name": HOOK, "model_name": "toy-chat"})).save(narrow)
    cases.append((["--sae", str(narrow), "--model", "toy-chat", "--evals", "core"], "d_in=64"))
    for args, expected in cases:
        out = tmp_path / "out"
        code, err = _bench([*args, "--out", str(out)], capsys)
        assert code == 2, args
        assert len(err) == 1 and err[0].startswith("error:") and expected in err[0], err
        assert not out.exists()


# ----------------------------------------------------------------------------- sparse probing

def test_sparse_probing_matches_saebench_functions(tl_lm, sae):
    """Mean-pooled residuals and latents against sae_bench_utils.activation_collection (its own capture on the
    same TransformerLens model and tokens), and every probe against probe_training.train_probe_on_activations
    with the same seed: per-class accuracies within 0.01 (the issue's bound for a probe's randomness)."""
    _need_sae_bench()
    import sae_bench.evals.sparse_probing.probe_training as their_probes
    import sae_bench.sae_bench_utils.activation_collection as their_acts

    from interp.hooks.lm import right_padded
    from interp.lm_text import start_token
    from saes.bench.evals.sparse_probing import (load_dataset, pooled_activations, probe_accuracies, split)

    options = BenchOptions(hook=HOOK, model_name="toy-chat", max_examples=24, seed=3)
    train_texts, test_texts = split(load_dataset("chat_world_kind", options), options.max_examples, options.seed)
    start, _ = start_token(tl_lm.tokenizer)
    adapter = _SAEForSAEBench(sae)
    adapter.dtype = torch.float32

    def both(texts_by_class):
        ours, theirs_llm, theirs_sae = {}, {}, {}
        for cls, texts in texts_by_class.items():
            ours[cls] = pooled_activations(tl_lm, sae, HOOK, texts, context=64, batch_size=16)
            ids = [[start] + row[:63] for row in tl_lm.tokenizer(texts, add_special_tokens=False)["input_ids"]]
            tokens, _ = right_padded(tl_lm, ids)  # padded with the pad token, which SAEBench masks
            bld = their_acts.get_all_llm_activations({cls: {"input_ids": tokens}}, tl_lm.model, 16, 1, HOOK,
                                                     mask_bos_pad_eos_tokens=True)
            theirs_llm.update(their_acts.create_meaned_model_activations(bld))
            theirs_sae.update(their_acts.get_sae_meaned_activations(bld, adapter, 16))
        return ours, theirs_llm, theirs_sae

    ours_train, llm_train, sae_train = both(train_texts)
    ours_test, llm_test, sae_test = both(test_texts)
    for cls in train_texts:
        torch.testing.assert_close(ours_train[cls][0], llm_train[cls], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours_train[cls][1], sae_train[cls], rtol=1e-4, atol=1e-5)

    # jaxtyping 0.3 (this stack) carries train_probe_on_activations' dimension names into train_sklearn_probe,
    # where the one-vs-rest data are twice the per-class size: SAEBench's own call fails its own shape check. The
    # checks are off for SAEBench's calls only (they check annotations, not numbers).
    from jaxtyping import config as jaxtyping_config

    jaxtyping_config.update("jaxtyping_disable", True)
    try:
        for train, test in ((llm_train, llm_test), (sae_train, sae_test)):
            for k in (None, 1, 5):
                _compare_probes(their_probes, train, test, k, options.seed, set(train_texts))
    finally:
        jaxtyping_config.update("jaxtyping_disable", False)


def _compare_probes(their_probes, train, test, k, seed, classes):
    from saes.bench.evals.sparse_probing import probe_accuracies

    torch.manual_seed(seed)
    _, theirs = their_probes.train_probe_on_activations(
        train, test, select_top_k=k, use_sklearn=k is not None, batch_size=250, epochs=100, lr=1e-2)
    ours = probe_accuracies(train, test, k, seed)
    assert set(ours) == set(theirs) == classes
    for cls in ours:
        print(k, ours, theirs)
    assert abs(ours[cls] - theirs[cls]) <= 0.01, (k, cls, ours[cls], theirs[cls])


def test_bench_sparse_probing_json_and_one_class_dataset(tmp_path, capsys):
    """`saes bench --evals sparse_probing` on a labelled file: valid SAEBench JSON; a one-class file: one line,
    nothing written."""
    _need_sae_bench()
    from saes.__main__ import main
    from zoo.chat.world import World, WorldConfig

    rows = World(WorldConfig(seed=0)).mixture("held_out", 160, {"general": 0.5, "harmful": 0.5}, seed=1)
    labelled = tmp_path / "kinds.jsonl"
    labelled.write_text("".join(json.dumps({"text": r["prompt"], "label": r["kind"]}) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["bench", "--sae", str(SAE_DIR), "--model", "toy-chat", "--evals", "sparse_probing",
                 "--dataset", str(labelled), "--max-examples", "40", "--out", str(out), "--option", "ks=[1,2]",
                 "--threads", "1"]) == 0
    capsys.readouterr()
    (path,) = out.rglob("*.json")
    result = json.loads(path.read_text())
    validate(result)
    metrics = result["eval_result_metrics"]
    assert metrics["llm"]["llm_top_5_test_accuracy"] is None and metrics["sae"]["sae_top_2_test_accuracy"] is not None
    assert result["eval_result_details"][0]["dataset_name"] == "kinds.jsonl"
    assert metrics["llm"]["llm_test_accuracy"] > 0.8  # harmful vs general requests: plain in the residual

    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"text": r["prompt"], "label": "general"}) + "\n" for r in rows[:20]))
    out2 = tmp_path / "out2"
    code, err = _bench(["--sae", str(SAE_DIR), "--model", "toy-chat", "--evals", "core,sparse_probing",
                        "--dataset", str(one), "--out", str(out2)], capsys)
    assert code == 2 and len(err) == 1 and "has 1 class ('general')" in err[0], err
    assert not out2.exists()


def test_shipped_bench_results_validate_and_plot(tmp_path):
    """The bench results committed beside the shipped LM SAEs are valid SAEBench JSON, and plot against L0."""
    _need_sae_bench()
    from saes.bench.plots import collect, write_html, write_png

    root = Path(__file__).resolve().parents[1] / "saes" / "pretrained"
    shipped = sorted(root.glob("*/*/saebench/*/*_eval_results.json"))
    assert {p.parent.name for p in shipped} >= {"core", "sparse_probing"}
    # and the results of SAEs not shipped (experiments/results/saebench_lm_*: SmolLM2's sweep), as committed
    swept = sorted((root.parents[1] / "experiments" / "results").glob("saebench_lm_*/*/*/*_eval_results.json"))
    assert swept
    for path in shipped + swept[:1]:  # one of the sweep's (1 MB each: validating all costs ~2 s apiece)
        validate(json.loads(path.read_text()))
    rows = collect([root / "toy-chat"])
    assert len(rows) == 1 and rows[0]["l0"] == pytest.approx(16.0) and rows[0]["sae_top_1_test_accuracy"] > 0.5
    write_png(rows, tmp_path / "p.png")
    write_html(rows, tmp_path / "p.html", "cdn")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "CE loss score" in (tmp_path / "p.html").read_text()


def test_plot_series_join_one_architectures_sweep_and_keep_other_folders_apart():
    """SAEBench's plot with many SAEs: one line per model / architecture / results folder, through its SAEs in
    order of L0; the folder is named only where the same architecture comes from several folders."""
    from saes.bench.plots import figure, group_rows

    def row(sae, l0, ce, arch="topk", source="sweep"):
        return {"model": "m", "sae": sae, "architecture": arch, "d_sae": 8, "l0": l0, "source": source,
                "core:ce_loss_score": ce}

    rows = group_rows([row("k64", 64, 0.99), row("k8", 8, 0.80), row("k16", 16, 0.90),
                       row("shipped-k32", 32, 0.95, source="shipped"), row("b32", 32, 0.94, arch="batchtopk")])
    assert {r["group"] for r in rows} == {"m / topk [sweep]", "m / topk [shipped]", "m / batchtopk"}
    fig = figure(rows, (("core:ce_loss_score", "CE"),))
    traces = {t.name: t for t in fig.data}
    assert set(traces) == {"m / topk [sweep]", "m / topk [shipped]", "m / batchtopk"}
    sweep = traces["m / topk [sweep]"]
    assert list(sweep.x) == [8, 16, 64] and list(sweep.y) == [0.80, 0.90, 0.99] and sweep.mode == "lines+markers"
    assert list(sweep.text) == ["k8", "k16", "k64"] and traces["m / batchtopk"].mode == "markers"
