"""Export an SAE's feature cards in the formats the field's viewers read: SAEDashboard's Neuronpedia batch files
and Neuronpedia's bulk-import tree.

    python -m saes export --sae saes/pretrained/smollm2/blocks.15.hook_resid_post --format saedashboard --out runs/np
    python -m saes export --sae saes/pretrained/toy/up_blocks.1.attentions.1 --format neuronpedia --out runs/np-img

**saedashboard** writes what SAEDashboard's `NeuronpediaRunner` writes (`sae_dashboard/neuronpedia/
neuronpedia_dashboard.py`'s `NeuronpediaDashboardBatch`): ``batch-{i}.json`` holding ``model_id``, ``layer``,
``sae_set``, ``sae_id_suffix`` and ``features`` (``feature_index``, ``neuron_alignment_*``, ``correlated_*``,
``pos_str``/``pos_values``, ``neg_str``/``neg_values``, ``frac_nonzero``, ``freq_hist_data_bar_*``,
``logits_hist_data_bar_*``, ``n_prompts_total``, ``n_tokens_in_prompt``, ``dataset``, ``activations``,
``decoder_weights_dist``, ``vector``), and ``run_settings.json``.

**neuronpedia** writes the tree that Neuronpedia's importer reads (neuronpedia-utils'
``convert-saedashboard-to-neuronpedia-export.py`` and its ``db_models``): ``{model}/{layer}-{sourceset}[__{suffix}]/``
with ``release.jsonl``, ``model.jsonl``, ``sourceset.jsonl``, ``source.jsonl`` (``saelensConfig``: the SAE's
cfg.json) and ``features/batch-{i}.jsonl.gz`` / ``activations/batch-{i}.jsonl.gz``.

Where each field comes from (the project's cards are the source: an export equals them):

- activation records: the cards' top contexts (LM: tokens and per-token activations, ``qualifying_token_index`` =
  the context's top token) in SAEDashboard's "TOP ACTIVATIONS" bin (``bin_min`` -1, ``bin_max`` the feature's
  maximum, ``bin_contains`` -1); the number of records is the cards' (`saes features --top N`);
- ``pos_*`` / ``neg_*``: the cards' promoted / suppressed tokens; ``logits_hist_data_*``: SAEDashboard's histogram
  (50 equal bins between the minimum and maximum, centres as values) of the decoder direction's logit effect on
  every token of the vocabulary, through the model's own final norm and head (`interp.hooks.lm_steer.logit_effects`,
  the cards' computation), so the model is loaded;
- ``frac_nonzero``: the cards' frequency; ``freq_hist_data_*``: the cards' activation histogram (its bins'
  centres and counts);
- ``neuron_alignment_*``: SAEDashboard's table from the decoder row (its 3 largest entries, their share of the
  row's L1 norm); Neuronpedia's ``topkCosSimIndices``/``Values``: the 10 nearest decoder directions by cosine;
- left empty, as SAEDashboard leaves them when its runner is not asked for them: ``correlated_neurons_*`` and
  ``correlated_features_*`` (activation correlations over a corpus, which the cards do not keep) and
  ``decoder_weights_dist`` (attention heads' share, for SAEs on ``hook_z`` only).

**Image SAEs** (a text-to-image block's cards over an image pool) use the same files; each activation record reads
as text to any viewer (``tokens`` are the latent grid's cells ``r{row}c{col}``, ``values`` the feature's heatmap
flattened row by row, ``qualifying_token_index`` the hottest cell; logit fields are empty: a block's update has no
unembedding), and its image extension lies in a file of its own beside it, which a viewer that does not know it
never opens, so that SAEDashboard's and Neuronpedia's own readers (whose dataclasses refuse unknown fields) still
read every other file unchanged: ``images-{i}.json`` (saedashboard; not ``batch-*``, which Neuronpedia's converter
reads as batches) or ``images/batch-{i}.jsonl.gz`` (neuronpedia; a folder its importer does not read), one entry per activation record, in the same order (saedashboard: ``{"feature_index",
"records": [...]}`` per feature; neuronpedia: ``{"id"}`` of the activation line), each record ``{"pool_index",
"prompt", "seed", "grid": [h, w], "heatmap": [[...]], "thumbnail_png_base64"}`` (the pool image the card points
into, a PNG of at most 64 x 64 pixels; seed null for a pool that recorded none).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from interp.atomic import atomic_write
from interp.cli import add_out_argument
from interp.shipped import refuse_shipped

from .pool import FEATURES_FILENAME, load_analysis_images, load_pool_seeds
from .sae import CFG_FILENAME, SAE
from .strict_json import dumps

FORMATS = ("saedashboard", "neuronpedia")
LOGITS_HIST_BINS = 50          # SAEDashboard's LogitsHistogramConfig default
NEURON_ALIGNMENT_ROWS = 3      # SAEDashboard's FeatureTablesConfig n_rows
COSINE_NEIGHBOURS = 10
MAX_FEATURES_PER_BATCH = 4096
THUMBNAIL_SIZE = 64
CREATOR = "interp-workbench"
EXPORT_ELSEWHERE = "write the export to a directory of your own with --out"


class ExportError(ValueError):
    """An SAE that cannot be exported as asked, with the reason and what to do."""


@dataclass
class ExportConfig:
    """What an export writes; plain values."""

    format: str = "saedashboard"
    features_per_batch: int = 128
    sae_set: str | None = None          # SAEDashboard's sae_set / Neuronpedia's source set (default: res-<d_sae>)
    release: str = "interp-workbench"
    model_id: str | None = None         # default: the cards' model
    thumbnails: bool = True

    def validate(self) -> "ExportConfig":
        if self.format not in FORMATS:
            raise ExportError(f"unknown export format {self.format!r}; choose one of: {', '.join(FORMATS)}")
        n = self.features_per_batch
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FEATURES_PER_BATCH:
            raise ExportError(f"--features-per-batch must be a whole number from 1 to {MAX_FEATURES_PER_BATCH}, "
                              f"got {n!r}")
        for name in ("sae_set", "release", "model_id"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}", value):
                raise ExportError(f"--{name.replace('_', '-')} must be 1-80 letters, digits, '.', '_' or '-' "
                                  f"(it names files and URLs), got {value!r}")
        return self


# ----------------------------------------------------------------------------- reading what is exported

def read_cards(sae_dir: Path) -> dict:
    """The cards beside an SAE, or an ExportError that names the command that makes them."""
    path = sae_dir / FEATURES_FILENAME
    if not (sae_dir / CFG_FILENAME).is_file():
        raise ExportError(f"{sae_dir} is not an SAE directory (no {CFG_FILENAME})")
    if not path.is_file():
        raise ExportError(
            f"{sae_dir} has no feature cards ({FEATURES_FILENAME}); make them first: `python -m saes features --sae "
            f"{sae_dir} --model MODEL --text CORPUS` for a language-model SAE, or `--world N --out DIR` for an "
            f"image SAE")
    try:
        cards = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(cards, dict) or not isinstance(cards.get("features"), list):
        raise ExportError(f"{path} holds no feature cards (no 'features' list)")
    return cards


def is_lm_cards(cards: dict) -> bool:
    from .lm_features import KIND

    return cards.get("kind") == KIND


def hook_layer(hook: str | None) -> int | None:
    match = re.fullmatch(r"blocks\.(\d+)\.hook_\w+", hook or "")
    return int(match.group(1)) if match else None


def _round(values, digits: int = 3) -> list[float]:
    return [float(round(float(v), digits)) for v in values]


def histogram(data: torch.Tensor, bins: int) -> tuple[list[float], list[float]]:
    """SAEDashboard's HistogramData.from_data: (bar centres, bar heights) of equal bins from min to max."""
    if data.numel() == 0:
        return [], []
    data = data.float()
    low, high = data.min().item(), data.max().item()
    size = (high - low) / bins
    edges = torch.linspace(low, high, bins + 1)
    heights = torch.histc(data, bins=bins, min=low, max=high).int().tolist()
    return [round(x, 5) for x in (edges[:-1] + size / 2).tolist()], [float(h) for h in heights]


def neuron_alignment(row: torch.Tensor) -> tuple[list[int], list[float], list[float]]:
    """SAEDashboard's neuron-alignment table of one decoder row: its largest entries and their share of the L1."""
    top = row.float().topk(min(NEURON_ALIGNMENT_ROWS, row.numel()))
    l1 = row.float().abs().sum().clamp_min(1e-12)
    return top.indices.tolist(), _round(top.values), _round(top.values.abs() / l1)


def cosine_neighbours(W_dec: torch.Tensor, features: list[int], k: int = COSINE_NEIGHBOURS
                      ) -> dict[int, tuple[list[int], list[float]]]:
    """Each feature's nearest other decoder directions by cosine (Neuronpedia's topkCosSim)."""
    unit = torch.nn.functional.normalize(W_dec.float(), dim=1)
    out = {}
    for first in range(0, len(features), 512):
        chunk = features[first:first + 512]
        sims = unit[chunk] @ unit.T
        sims[torch.arange(len(chunk)), torch.tensor(chunk)] = -math.inf
        top = sims.topk(min(k, unit.shape[0] - 1), dim=1)
        for f, idx, val in zip(chunk, top.indices.tolist(), top.values.tolist()):
            out[f] = (idx, _round(val, 4))
    return out


# ----------------------------------------------------------------------------- LM features

def _lm_logit_histograms(lm, W_dec: torch.Tensor, features: list[int]) -> dict[int, tuple[list, list]]:
    from interp.hooks.lm_steer import logit_effects

    out = {}
    for first in range(0, len(features), 256):
        chunk = features[first:first + 256]
        effects = logit_effects(lm, W_dec[chunk])
        for f, row in zip(chunk, effects):
            out[f] = histogram(row, LOGITS_HIST_BINS)
    return out


def lm_feature(card: dict, cards: dict, W_dec: torch.Tensor, logits_hist) -> dict:
    f = int(card["id"])
    indices, values, l1 = neuron_alignment(W_dec[f])
    edges, counts = card["histogram"]["edges"], card["histogram"]["counts"]
    centres = [round((a + b) / 2, 5) for a, b in zip(edges[:-1], edges[1:])] if card["n_firing"] else []
    records = [{"bin_min": -1, "bin_max": float(card["max_activation"]), "bin_contains": -1,
                "tokens": list(c["tokens"]), "values": _round(c["activations"]),
                "qualifying_token_index": int(c["highlight"])} for c in card["top_contexts"]]
    hist_values, hist_heights = logits_hist[f]
    corpus = cards.get("corpus") or {}
    return {"feature_index": f,
            "neuron_alignment_indices": indices, "neuron_alignment_values": values, "neuron_alignment_l1": l1,
            "correlated_neurons_indices": [], "correlated_neurons_l1": [], "correlated_neurons_pearson": [],
            "correlated_features_indices": [], "correlated_features_l1": [], "correlated_features_pearson": [],
            "neg_str": [t["token"] for t in card["suppressed"]], "neg_values": _round(t["logit"] for t in
                                                                                      card["suppressed"]),
            "pos_str": [t["token"] for t in card["promoted"]], "pos_values": _round(t["logit"] for t in
                                                                                    card["promoted"]),
            "frac_nonzero": float(card["frequency"]),
            "freq_hist_data_bar_values": centres if card["n_firing"] else [],
            "freq_hist_data_bar_heights": [float(c) for c in counts] if card["n_firing"] else [],
            "logits_hist_data_bar_heights": hist_heights, "logits_hist_data_bar_values": hist_values,
            "n_prompts_total": int(corpus.get("sequences", 0)),
            "n_tokens_in_prompt": int((cards.get("config") or {}).get("max_length", 0)),
            "dataset": str(corpus.get("path", "")),
            "decoder_weights_dist": [], "activations": records, "vector": []}


# ----------------------------------------------------------------------------- image features

def _thumbnail(image: np.ndarray) -> str:
    from PIL import Image

    picture = Image.fromarray(image)
    picture.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def image_feature(card: dict, W_dec: torch.Tensor, pool, seeds: list | None, thumbnails: dict | None
                  ) -> tuple[dict, list[dict]]:
    """(the feature in SAEDashboard's form, the image extension of each of its activation records); `thumbnails`
    caches each pool image's thumbnail by index (None: no thumbnails)."""
    f = int(card["id"])
    indices, values, l1 = neuron_alignment(W_dec[f])
    records, extensions = [], []
    for top in card.get("top_images") or []:
        heatmap = np.asarray(top["heatmap"], dtype=np.float64)
        h, w = heatmap.shape
        flat = heatmap.ravel()
        index = int(top["index"])
        extension = {"pool_index": index, "grid": [h, w], "heatmap": heatmap.tolist(),
                     "prompt": pool[1][index] if pool is not None and index < len(pool[1]) else None,
                     "seed": seeds[index] if seeds is not None and index < len(seeds) else None}
        if thumbnails is not None and pool is not None and index < len(pool[0]):
            if index not in thumbnails:
                thumbnails[index] = _thumbnail(pool[0][index])
            extension["thumbnail_png_base64"] = thumbnails[index]
        records.append({"bin_min": -1, "bin_max": float(top["activation"]), "bin_contains": -1,
                        "tokens": [f"r{r}c{c}" for r in range(h) for c in range(w)], "values": _round(flat),
                        "qualifying_token_index": int(flat.argmax())})
        extensions.append(extension)
    return {"feature_index": f,
            "neuron_alignment_indices": indices, "neuron_alignment_values": values, "neuron_alignment_l1": l1,
            "correlated_neurons_indices": [], "correlated_neurons_l1": [], "correlated_neurons_pearson": [],
            "correlated_features_indices": [], "correlated_features_l1": [], "correlated_features_pearson": [],
            "neg_str": [], "neg_values": [], "pos_str": [], "pos_values": [],
            "frac_nonzero": float(card["frequency"]),
            "freq_hist_data_bar_values": [], "freq_hist_data_bar_heights": [],
            "logits_hist_data_bar_heights": [], "logits_hist_data_bar_values": [],
            "n_prompts_total": 0, "n_tokens_in_prompt": 0, "dataset": "",
            "decoder_weights_dist": [], "activations": records, "vector": []}, extensions


# ----------------------------------------------------------------------------- the export

def _write(path: Path, text: str, compress: bool = False) -> None:
    data = text.encode()
    if compress:
        data = gzip.compress(data, compresslevel=5, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    atomic_write(path, write)


def export_sae(sae_dir, out, config: ExportConfig | None = None, lm=None, overwrite: bool = False) -> dict:
    """Export the cards of the SAE in `sae_dir` into `out` (see the module's docstring). `lm` is the loaded
    language model for an LM SAE's logit histograms (loaded from the cards' model name when None). Returns a
    summary: the files written and the feature count."""
    config = (config or ExportConfig()).validate()
    sae_dir, out = Path(sae_dir), Path(out)
    if not sae_dir.is_dir():
        raise ExportError(f"no SAE directory at {sae_dir}")
    if not overwrite:
        refuse_shipped([out], "saes export", EXPORT_ELSEWHERE)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out} exists and is not empty; give a new directory, or --overwrite to replace its files")
    cards = read_cards(sae_dir)
    sae = SAE.load(sae_dir)
    W_dec = sae.W_dec.detach().float()
    if len(cards["features"]) != sae.cfg.d_sae:
        raise ExportError(f"the cards in {sae_dir} describe {len(cards['features'])} features but the SAE has "
                          f"{sae.cfg.d_sae}; remake them with `python -m saes features`")
    lm_kind = is_lm_cards(cards)
    hook = cards.get("hook") or cards.get("block") or sae.cfg.metadata.get("hook_name") or sae_dir.name
    model_id = config.model_id or str(cards.get("model") or sae.cfg.metadata.get("model_name") or "model")
    layer = hook_layer(hook)
    suffix = None if layer is not None else str(hook)  # an image block has no layer number: it names the source
    layer = 0 if layer is None else layer
    sae_set = config.sae_set or f"{'res' if lm_kind else 'img'}-{sae.cfg.d_sae}"
    features = [int(c["id"]) for c in cards["features"]]
    if lm_kind:
        if lm is None:
            from interp.models.lm import load_lm

            name = cards.get("model") or sae.cfg.metadata.get("model_name")
            if not name:
                raise ExportError(f"the cards in {sae_dir} name no model; remake them with `python -m saes features`")
            lm = load_lm(str(name))
        from interp.hooks.lm_steer import check_sae_fits

        check_sae_fits(lm, sae, where=f"the SAE in {sae_dir}")
        logits_hist = _lm_logit_histograms(lm, W_dec, features)
        exported = [lm_feature(card, cards, W_dec, logits_hist) for card in cards["features"]]
        images = None
    else:
        root = sae_dir.parent
        pool, seeds = load_analysis_images(root), load_pool_seeds(root)
        if pool is None:
            raise ExportError(f"the image pool the cards in {sae_dir} point into is not in {root} "
                              f"(analysis_images.npz); remake the cards with `python -m saes features --pool-dir`")
        thumbnails = {} if config.thumbnails else None
        pairs = [image_feature(card, W_dec, pool, seeds, thumbnails) for card in cards["features"]]
        exported, images = [p[0] for p in pairs], [p[1] for p in pairs]
    per = config.features_per_batch
    batches = [exported[i:i + per] for i in range(0, len(exported), per)]
    image_batches = [images[i:i + per] for i in range(0, len(images), per)] if images is not None else None
    written = []
    settings = {"sae_path": str(sae_dir), "sae_set": sae_set, "model_id": model_id, "layer": layer,
                "hook_name": hook, "np_sae_id_suffix": suffix, "n_features": len(exported),
                "n_features_per_batch": config.features_per_batch, "kind": "lm" if lm_kind else "image",
                "n_prompts_total": exported[0]["n_prompts_total"] if exported else 0,
                "n_tokens_in_prompt": exported[0]["n_tokens_in_prompt"] if exported else 0,
                "dataset": exported[0]["dataset"] if exported else "", "cards": str(sae_dir / FEATURES_FILENAME),
                "logits_hist_bins": LOGITS_HIST_BINS, "neuron_alignment_rows": NEURON_ALIGNMENT_ROWS}
    if config.format == "saedashboard":
        for i, batch in enumerate(batches):
            payload = {"model_id": model_id, "layer": layer, "sae_set": sae_set, "sae_id_suffix": suffix,
                       "features": batch}
            _write(out / f"batch-{i}.json", dumps(payload, separators=(",", ":")))
            written.append(out / f"batch-{i}.json")
            if image_batches is not None:
                extension = [{"feature_index": f["feature_index"], "records": records}
                             for f, records in zip(batch, image_batches[i])]
                _write(out / f"images-{i}.json", dumps(extension, separators=(",", ":")))
                written.append(out / f"images-{i}.json")
        _write(out / "run_settings.json", dumps(settings, indent=2) + "\n")
        written.append(out / "run_settings.json")
    else:
        written += _neuronpedia_tree(out, batches, image_batches, sae, sae_dir, model_id, layer, sae_set, suffix,
                                     settings, config, W_dec, features)
    return {"format": config.format, "out": str(out), "features": len(exported), "batches": len(batches),
            "files": [str(p) for p in written]}


def source_id(layer: int, sae_set: str, suffix: str | None) -> str:
    return f"{layer}-{sae_set}" + (f"__{suffix}" if suffix else "")


def _neuronpedia_tree(out, batches, image_batches, sae, sae_dir, model_id, layer, sae_set, suffix, settings, config, W_dec,
                      features) -> list[Path]:
    created = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    source = source_id(layer, sae_set, suffix)
    root = out / model_id / source
    cfg_text = (sae_dir / CFG_FILENAME).read_text()
    records = {
        "release.jsonl": {"name": config.release, "description": f"SAEs exported by the interpretability workbench "
                          f"from {sae_dir.name}", "descriptionShort": config.release, "urls": [],
                          "creatorNameShort": CREATOR, "creatorName": CREATOR, "creatorId": CREATOR,
                          "visibility": "PUBLIC", "createdAt": created},
        "model.jsonl": {"id": model_id, "instruct": "instruct" in model_id or "chat" in model_id,
                        "displayNameShort": model_id, "displayName": model_id, "creatorId": CREATOR,
                        "dimension": sae.cfg.d_in, "visibility": "PUBLIC", "createdAt": created,
                        "updatedAt": created},
        "sourceset.jsonl": {"modelId": model_id, "name": sae_set, "creatorId": CREATOR, "creatorName": CREATOR,
                            "releaseName": config.release, "description": f"{settings['kind']} SAE, "
                            f"{sae.cfg.d_sae} latents", "visibility": "PUBLIC", "hasDashboards": True,
                            "createdAt": created},
        "source.jsonl": {"id": source, "modelId": model_id, "setName": sae_set, "creatorId": CREATOR,
                         "visibility": "PUBLIC", "hasDashboards": True, "inferenceEnabled": False,
                         "saelensConfig": cfg_text, "dataset": settings["dataset"] or None,
                         "num_prompts": settings["n_prompts_total"] or None,
                         "num_tokens_in_prompt": settings["n_tokens_in_prompt"] or None,
                         "notes": f"hook {settings['hook_name']}", "createdAt": created},
    }
    written = []
    for name, record in records.items():
        _write(root / name, dumps(record) + "\n")
        written.append(root / name)
    neighbours = cosine_neighbours(W_dec, features)
    hook_name = settings["hook_name"]
    for i, batch in enumerate(batches):
        feature_lines, activation_lines, image_lines = [], [], []
        for n, feature in enumerate(batch):
            f = feature["feature_index"]
            values = [max(a["values"]) for a in feature["activations"] if a["values"]]
            feature_lines.append(dumps({
                "modelId": model_id, "layer": source, "index": str(f), "creatorId": CREATOR, "createdAt": created,
                "maxActApprox": max(values) if values else 0.0, "hasVector": False, "vector": [],
                "vectorLabel": None, "hookName": hook_name, "topkCosSimIndices": neighbours[f][0],
                "topkCosSimValues": neighbours[f][1],
                **{key: feature[key] for key in NEURONPEDIA_FEATURE_FIELDS}}))
            for j, record in enumerate(feature["activations"]):
                top = int(np.argmax(record["values"])) if record["values"] else 0
                line = {"id": f"{source}-{f}-{j}", "tokens": record["tokens"], "index": str(f), "layer": source,
                        "modelId": model_id, "maxValue": max(record["values"], default=0.0),
                        "maxValueTokenIndex": top, "minValue": min(record["values"], default=0.0),
                        "values": record["values"], "creatorId": CREATOR, "dataSource": None, "dataIndex": None,
                        "dfaValues": [], "dfaTargetIndex": None, "dfaMaxValue": None, "createdAt": created,
                        "lossValues": [], "logitContributions": None, "binMin": record["bin_min"],
                        "binMax": record["bin_max"], "binContains": record["bin_contains"],
                        "qualifyingTokenIndex": record["qualifying_token_index"]}
                activation_lines.append(dumps(line))
                if image_batches is not None:
                    image_lines.append(dumps({"id": line["id"], **image_batches[i][n][j]}))
        files = [("features", feature_lines), ("activations", activation_lines)]
        if image_batches is not None:
            files.append(("images", image_lines))
        for folder, lines in files:
            path = root / folder / f"batch-{i}.jsonl.gz"
            _write(path, "".join(line + "\n" for line in lines), compress=True)
            written.append(path)
    return written


# the Feature fields that Neuronpedia's importer copies from SAEDashboard's batch feature unchanged
NEURONPEDIA_FEATURE_FIELDS = (
    "neuron_alignment_indices", "neuron_alignment_values", "neuron_alignment_l1", "correlated_neurons_indices",
    "correlated_neurons_pearson", "correlated_neurons_l1", "correlated_features_indices",
    "correlated_features_pearson", "correlated_features_l1", "neg_str", "neg_values", "pos_str", "pos_values",
    "frac_nonzero", "freq_hist_data_bar_heights", "freq_hist_data_bar_values", "logits_hist_data_bar_heights",
    "logits_hist_data_bar_values", "decoder_weights_dist")


# ----------------------------------------------------------------------------- the command

def add_export_arguments(parser) -> None:
    parser.add_argument("--sae", required=True, nargs="+", help="SAE directories with feature cards (features.json)")
    parser.add_argument("--format", required=True, help=f"one of: {', '.join(FORMATS)}")
    add_out_argument(parser, required=True, help="output directory (one subdirectory per SAE when several)")
    parser.add_argument("--features-per-batch", type=int, default=128)
    parser.add_argument("--sae-set", default=None, help="the SAE set / Neuronpedia source set name (res-<d_sae>)")
    parser.add_argument("--release", default="interp-workbench", help="Neuronpedia release name")
    parser.add_argument("--model-id", default=None, help="the model's id in the export (default: the cards')")
    parser.add_argument("--no-thumbnails", action="store_true", help="image SAEs: leave out the PNG thumbnails")


def export_command(args) -> int:
    config = ExportConfig(format=args.format, features_per_batch=args.features_per_batch, sae_set=args.sae_set,
                          release=args.release, model_id=args.model_id,
                          thumbnails=not args.no_thumbnails).validate()
    dirs = [Path(p) for p in args.sae]
    outs = [Path(args.out) / d.name for d in dirs] if len(dirs) > 1 else [Path(args.out)]
    if not args.overwrite:
        refuse_shipped(outs, "saes export", EXPORT_ELSEWHERE)
    for d in dirs:  # every SAE checked before any is written
        read_cards(d)
    for d, out in zip(dirs, outs):
        summary = export_sae(d, out, config, overwrite=args.overwrite)
        print(f"{d}: {summary['features']} features in {summary['batches']} batch(es), {config.format} format, "
              f"into {out}")
    return 0


__all__ = ["ExportConfig", "ExportError", "FORMATS", "export_sae", "export_command", "add_export_arguments",
           "histogram", "neuron_alignment", "read_cards"]
