"""`saes export`: SAEDashboard's Neuronpedia batches and Neuronpedia's bulk-import tree, for text and image SAEs.

The batch files are parsed by SAEDashboard's own dataclasses (sae-dashboard, installed with --no-deps from
requirements-anchors.txt) and must equal their round trip; every record must equal the project's own cards.
Neuronpedia's importer (neuronpedia-utils' `db_models`) is not a registry package: the tree is read back against
its dataclasses' field names, listed below as that code defines them."""

from __future__ import annotations

import base64
import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from saes.export import ExportConfig, ExportError, export_sae, histogram, read_cards
from saes.sae import SAE

ROOT = Path(__file__).resolve().parents[1]
CHAT_SAE = ROOT / "saes/pretrained/toy-chat/blocks.1.hook_resid_post"
TOY_SAE = ROOT / "saes/pretrained/toy/up_blocks.1.attentions.1"

# neuronpedia-utils db_models: Feature, Activation, Source, SourceSet, SourceRelease, Model (required fields first)
NP_FEATURE = {"modelId", "layer", "index", "creatorId", "createdAt", "maxActApprox", "hasVector", "vector",
              "vectorLabel", "vectorDefaultSteerStrength", "hookName", "topkCosSimIndices", "topkCosSimValues",
              "neuron_alignment_indices", "neuron_alignment_values", "neuron_alignment_l1",
              "correlated_neurons_indices", "correlated_neurons_pearson", "correlated_neurons_l1",
              "correlated_features_indices", "correlated_features_pearson", "correlated_features_l1", "neg_str",
              "neg_values", "pos_str", "pos_values", "frac_nonzero", "freq_hist_data_bar_heights",
              "freq_hist_data_bar_values", "logits_hist_data_bar_heights", "logits_hist_data_bar_values",
              "decoder_weights_dist"}
NP_ACTIVATION = {"id", "tokens", "index", "layer", "modelId", "maxValue", "maxValueTokenIndex", "minValue", "values",
                 "creatorId", "dataSource", "dataIndex", "dfaValues", "dfaTargetIndex", "dfaMaxValue", "createdAt",
                 "lossValues", "logitContributions", "binMin", "binMax", "binContains", "qualifyingTokenIndex"}
NP_SOURCE = {"id", "modelId", "setName", "creatorId", "hasDashboards", "inferenceEnabled", "inferenceHosts",
             "saelensConfig", "saelensRelease", "saelensSaeId", "hfRepoId", "hfFolderId", "visibility",
             "defaultOfModelId", "hasUmap", "hasUmapLogSparsity", "hasUmapClusters", "num_prompts",
             "num_tokens_in_prompt", "dataset", "notes", "createdAt"}
NP_SOURCESET = {"modelId", "name", "creatorId", "hasDashboards", "visibility", "description", "type", "creatorName",
                "urls", "creatorEmail", "releaseName", "defaultOfModelId", "defaultRange", "defaultShowBreaks",
                "showDfa", "showCorrelated", "showHeadAttribution", "showUmap", "createdAt"}
NP_RELEASE = {"name", "description", "creatorName", "creatorId", "visibility", "isNewUi", "featured",
              "descriptionShort", "urls", "creatorEmail", "creatorNameShort", "defaultSourceSetName",
              "defaultSourceId", "defaultUmapSourceIds", "createdAt"}
NP_MODEL = {"id", "instruct", "creatorId", "displayNameShort", "displayName", "tlensId", "dimension", "visibility",
            "defaultSourceSetName", "defaultSourceId", "inferenceEnabled", "layers", "neuronsPerLayer", "createdAt",
            "owner", "updatedAt", "website"}
NP_REQUIRED = {"feature": {"modelId", "layer", "index"},
               "activation": {"id", "tokens", "index", "layer", "modelId", "maxValue", "maxValueTokenIndex",
                              "minValue", "values", "creatorId"}}


@pytest.fixture(scope="module")
def chat_lm():
    from interp.models.lm import load_lm

    return load_lm("toy-chat")


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory, chat_lm):
    out = tmp_path_factory.mktemp("chat") / "saedashboard"
    summary = export_sae(CHAT_SAE, out, ExportConfig(features_per_batch=400), lm=chat_lm)
    return out, summary


def test_lm_batches_parse_with_saedashboards_dataclasses_and_equal_the_cards(chat_export, chat_lm):
    from sae_dashboard.neuronpedia.neuronpedia_dashboard import NeuronpediaDashboardBatch

    out, summary = chat_export
    cards = read_cards(CHAT_SAE)
    sae = SAE.load(CHAT_SAE)
    assert summary["batches"] == 3 and summary["features"] == sae.cfg.d_sae == len(cards["features"])
    exported = []
    for i in range(3):
        payload = json.loads((out / f"batch-{i}.json").read_text())
        parsed = NeuronpediaDashboardBatch(**payload)
        assert json.loads(json.dumps(parsed.to_dict())) == payload  # SAEDashboard's round trip changes nothing
        assert (payload["model_id"], payload["layer"], payload["sae_set"]) == ("toy-chat", 1, f"res-{sae.cfg.d_sae}")
        exported += payload["features"]
    assert [f["feature_index"] for f in exported] == list(range(sae.cfg.d_sae))
    from interp.hooks.lm_steer import logit_effects

    vocab = logit_effects(chat_lm, sae.W_dec[:1].float()).shape[1]
    fired = [c for c in cards["features"] if c["n_firing"] > 0]
    assert len(fired) > 100
    for card in fired[:50]:
        feature = exported[card["id"]]
        assert feature["frac_nonzero"] == card["frequency"]
        assert feature["pos_str"] == [t["token"] for t in card["promoted"]]
        assert feature["neg_str"] == [t["token"] for t in card["suppressed"]]
        assert feature["pos_values"] == pytest.approx([t["logit"] for t in card["promoted"]], abs=6e-4)
        assert len(feature["activations"]) == len(card["top_contexts"]) > 0
        for record, context in zip(feature["activations"], card["top_contexts"]):
            assert record["tokens"] == context["tokens"]
            assert record["values"] == pytest.approx(context["activations"], abs=6e-4)
            assert record["qualifying_token_index"] == context["highlight"]
            assert record["values"][record["qualifying_token_index"]] == pytest.approx(context["activation"],
                                                                                         abs=6e-4)
        # the logit histogram covers the whole vocabulary, and its range ends at the top promoted / suppressed logit
        heights, centres = feature["logits_hist_data_bar_heights"], feature["logits_hist_data_bar_values"]
        assert sum(heights) == vocab and len(heights) == 50
        width = centres[1] - centres[0]
        assert centres[-1] + width / 2 == pytest.approx(card["promoted"][0]["logit"], abs=2e-3)
        assert centres[0] - width / 2 == pytest.approx(card["suppressed"][0]["logit"], abs=2e-3)
        # SAEDashboard's neuron alignment: the decoder row's largest entries and their L1 share
        row = sae.W_dec[card["id"]].float()
        top = row.topk(3)
        assert feature["neuron_alignment_indices"] == top.indices.tolist()
        assert feature["neuron_alignment_l1"] == pytest.approx((top.values.abs() / row.abs().sum()).tolist(),
                                                               abs=6e-4)


def test_histogram_is_saedashboards():
    data = torch.tensor([0.0, 0.5, 1.0, 1.0, 3.0, -2.0])
    values, heights = histogram(data, 5)
    assert heights == [1.0, 0.0, 2.0, 2.0, 1.0]          # bins of width 1 from -2 to 3, the maximum in the last
    assert values == pytest.approx([-1.5, -0.5, 0.5, 1.5, 2.5])


def _jsonl_gz(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]


def test_lm_neuronpedia_tree_has_neuronpedias_fields(tmp_path, chat_lm, chat_export):
    summary = export_sae(CHAT_SAE, tmp_path / "np", ExportConfig(format="neuronpedia"), lm=chat_lm)
    root = tmp_path / "np" / "toy-chat" / "1-res-1024"
    for name, fields in (("release", NP_RELEASE), ("model", NP_MODEL), ("sourceset", NP_SOURCESET),
                         ("source", NP_SOURCE)):
        (record,) = [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()]
        assert set(record) <= fields, (name, set(record) - fields)
    source = json.loads((root / "source.jsonl").read_text())
    assert json.loads(source["saelensConfig"])["d_sae"] == 1024 and source["id"] == "1-res-1024"
    features = [f for i in range(summary["batches"]) for f in _jsonl_gz(root / "features" / f"batch-{i}.jsonl.gz")]
    activations = [a for i in range(summary["batches"])
                   for a in _jsonl_gz(root / "activations" / f"batch-{i}.jsonl.gz")]
    assert len(features) == 1024 and [int(f["index"]) for f in features] == list(range(1024))
    assert all(NP_REQUIRED["feature"] <= set(f) <= NP_FEATURE for f in features)
    assert all(NP_REQUIRED["activation"] <= set(a) <= NP_ACTIVATION for a in activations)
    batch = json.loads((chat_export[0] / "batch-0.json").read_text())["features"]
    for feature, line in zip(batch, features):  # the importer's copy of the batch feature, unchanged
        assert {k: line[k] for k in ("pos_str", "neg_values", "frac_nonzero", "logits_hist_data_bar_heights")} == \
            {k: feature[k] for k in ("pos_str", "neg_values", "frac_nonzero", "logits_hist_data_bar_heights")}
    cards = read_cards(CHAT_SAE)["features"]
    assert len(activations) == sum(len(c["top_contexts"]) for c in cards)
    first = next(a for a in activations if a["index"] == str(cards[0]["id"]))
    assert first["tokens"] == cards[0]["top_contexts"][0]["tokens"]
    assert first["maxValue"] == pytest.approx(cards[0]["top_contexts"][0]["activation"], abs=6e-4)
    neighbours = features[5]["topkCosSimIndices"]
    unit = torch.nn.functional.normalize(SAE.load(CHAT_SAE).W_dec.float(), dim=1)
    sims = unit[5] @ unit.T
    sims[5] = -2
    assert neighbours == sims.topk(10).indices.tolist()


def test_image_export_reads_as_text_and_carries_the_image_extension(tmp_path):
    from sae_dashboard.neuronpedia.neuronpedia_dashboard import NeuronpediaDashboardBatch
    from PIL import Image

    from saes.pool import load_analysis_images, load_pool_seeds

    summary = export_sae(TOY_SAE, tmp_path / "img", ExportConfig(features_per_batch=256))
    assert summary["batches"] == 1
    payload = json.loads((tmp_path / "img" / "batch-0.json").read_text())
    parsed = NeuronpediaDashboardBatch(**payload)              # a viewer that knows no images reads it all
    assert json.loads(json.dumps(parsed.to_dict())) == payload
    assert payload["sae_id_suffix"] == "up_blocks.1.attentions.1"
    extension = json.loads((tmp_path / "img" / "images-0.json").read_text())
    cards = read_cards(TOY_SAE)["features"]
    images, prompts = load_analysis_images(TOY_SAE.parent)
    seeds = load_pool_seeds(TOY_SAE.parent)
    checked = 0
    for card, feature, ext in zip(cards, payload["features"], extension):
        assert ext["feature_index"] == feature["feature_index"] == card["id"]
        assert len(ext["records"]) == len(feature["activations"]) == len(card["top_images"])
        for top, record, image in zip(card["top_images"], feature["activations"], ext["records"]):
            heatmap = np.asarray(top["heatmap"])
            assert image["heatmap"] == top["heatmap"] and image["grid"] == list(heatmap.shape)
            assert record["values"] == pytest.approx(heatmap.ravel(), abs=6e-4)
            assert record["tokens"][record["qualifying_token_index"]] == "r{}c{}".format(
                *np.unravel_index(heatmap.argmax(), heatmap.shape))
            assert image["prompt"] == prompts[top["index"]] and image["seed"] == seeds[top["index"]]
            thumb = Image.open(io.BytesIO(base64.b64decode(image["thumbnail_png_base64"])))
            assert max(thumb.size) <= 64
            small = np.asarray(Image.fromarray(images[top["index"]]).resize(thumb.size, Image.BILINEAR))
            assert np.abs(np.asarray(thumb.convert("RGB")).astype(int) - small.astype(int)).mean() < 12
            checked += 1
        if checked > 40:
            break
    assert checked > 40
    tree = export_sae(TOY_SAE, tmp_path / "np", ExportConfig(format="neuronpedia", thumbnails=False))
    root = tmp_path / "np" / "toy" / "0-img-256__up_blocks.1.attentions.1"
    activations = _jsonl_gz(root / "activations" / "batch-0.jsonl.gz")
    lines = [line for i in range(tree["batches"]) for line in _jsonl_gz(root / "images" / f"batch-{i}.jsonl.gz")]
    assert all(set(a) <= NP_ACTIVATION for a in activations)
    assert [line["id"] for line in lines[:len(activations)]] == [a["id"] for a in activations]
    assert "thumbnail_png_base64" not in lines[0]


def test_pool_seeds_are_the_images_seeds():
    """The shipped pool's seeds file says image i was generated with seed i: regenerate two and compare."""
    from interp.hooks import generate
    from interp.models.t2i import load_t2i

    from saes.pool import load_analysis_images, load_pool_seeds

    images, prompts = load_analysis_images(TOY_SAE.parent)
    seeds = load_pool_seeds(TOY_SAE.parent)
    model = load_t2i("toy")
    for i in (3, 250):
        array = generate(model, [prompts[i]], seed=[seeds[i]], output_type="np")
        again = np.clip(np.rint(np.asarray(array) * 255), 0, 255).astype(np.uint8)[0]
        assert np.abs(again.astype(int) - images[i].astype(int)).max() <= 2


def _cli(capsys, *args: str) -> tuple[int, str]:
    """(exit status, stderr) of `python -m saes export ARGS`, in this process."""
    from saes.__main__ import main

    try:
        code = main(["export", *args])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.parametrize("args, says", [
    (["--sae", str(TOY_SAE), "--format", "parquet"], "unknown export format 'parquet'"),
    (["--sae", str(TOY_SAE), "--format", "neuronpedia", "--features-per-batch", "0"], "--features-per-batch"),
    (["--sae", str(TOY_SAE), "--format", "neuronpedia", "--sae-set", "../x"], "--sae-set must be"),
    (["--sae", str(ROOT / "saes/pretrained/toy"), "--format", "neuronpedia"], "is not an SAE directory"),
])
def test_bad_exports_are_one_line_and_write_nothing(tmp_path, capsys, args, says):
    out = tmp_path / "out"
    code, err = _cli(capsys, *args, "--out", str(out))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_an_sae_without_cards_names_the_command_that_makes_them(tmp_path):
    bare = tmp_path / "sae"
    SAE.load(CHAT_SAE).save(bare)
    with pytest.raises(ExportError, match="python -m saes features"):
        export_sae(bare, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_into_shipped_files_is_refused(capsys):
    code, err = _cli(capsys, "--sae", str(TOY_SAE), "--format", "neuronpedia", "--out",
                     str(ROOT / "saes/pretrained/toy/export"))
    assert code == 2 and "shipped with the repository" in err
    assert not (ROOT / "saes/pretrained/toy/export").exists()


def test_cards_carry_the_logit_histograms_so_the_export_needs_no_model(tmp_path, chat_lm, monkeypatch):
    """Cards made now keep each feature's logit histogram (from the pass that finds its promoted tokens); the export
    reads it from them without loading the model, and it equals what the export computes through the model for
    cards made before they kept it."""
    import shutil

    import interp.models.lm
    from saes.lm_features import LMAnalysisConfig, analyse_lm_sae

    sae_dir = tmp_path / "sae"
    shutil.copytree(CHAT_SAE, sae_dir, ignore=shutil.ignore_patterns("features.*"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nwhat did the dog do with the red ball\n" * 20)
    analyse_lm_sae(chat_lm, SAE.load(sae_dir).eval(), corpus, sae_dir, LMAnalysisConfig(tokens=300),
                   model_name="toy-chat", sae_dir=sae_dir)
    cards = read_cards(sae_dir)
    assert all(len(c["logit_histogram"]["heights"]) == 50 for c in cards["features"])

    def no_model(*args, **kwargs):
        raise AssertionError("the export loaded the model")

    monkeypatch.setattr(interp.models.lm, "load_lm", no_model)
    export_sae(sae_dir, tmp_path / "from-cards", ExportConfig(features_per_batch=1024))
    for card in cards["features"]:
        del card["logit_histogram"]
    (sae_dir / "features.json").write_text(json.dumps(cards))
    export_sae(sae_dir, tmp_path / "through-model", ExportConfig(features_per_batch=1024), lm=chat_lm)
    ours, theirs = (json.loads((tmp_path / name / "batch-0.json").read_text())["features"]
                    for name in ("from-cards", "through-model"))
    assert len(ours) == 1024 and ours == theirs
