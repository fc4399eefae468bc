"""The image eval types of `saes bench` (issue 44): SAEBench's questions asked of an SAE on a text-to-image
denoiser block, in SAEBench's envelope. The metrics are `saes.bench.image`'s; this module registers them, reads
their options, and lays their (metrics, details) out as SAEBench results (metric categories, a details list, a
schema of this project's own: sae-bench 0.6.0 has none for images).

    python -m saes bench --sae saes/pretrained/toy/up_blocks.1.attentions.2 --model toy \\
        --evals image_reconstruction,image_sparse_probing,image_localisation --out runs/saebench

Options (--option key=value): n_images, probe_images, unlearn_images, riebench_per_category, ks ([1,2,5]),
multiplier. The capture pool and the concepts' unedited images are computed once per model in a process and
shared by every SAE and eval type of that run.
"""

from __future__ import annotations

import tempfile

from ..image import EVAL_TYPES, LIMITS, TRUTH_EVALS, ImageBenchConfig, require_world, run_image_evals
from ..registry import BenchOptions, EvalResult, EvalType, register_eval
from ..schema import register_schema

OPTIONS = ("n_images", "probe_images", "unlearn_images", "riebench_per_category", "ks", "multiplier")

# eval type -> metric category -> the metrics `saes.bench.image` returns that go there
CATEGORIES = {
    "image_reconstruction": {
        "reconstruction": ("explained_variance", "mse", "l0", "dead_fraction", "dense_features", "tokens"),
        "denoising": ("denoiser_loss_recovered", "latent_loss_recovered"),
        "probe": ("probe_accuracy_clean", "probe_accuracy_spliced", "probe_accuracy_zero")},
    "image_sparse_probing": {"raw_update": ("raw_update_test_accuracy", "raw_update_top_{k}_test_accuracy"),
                             "sae": ("sae_test_accuracy", "sae_top_{k}_test_accuracy",
                                     "sae_top_{k}_test_accuracy_{attribute}")},
    "image_localisation": {"localisation": ("mean_localisation", "mean_base_rate", "n_labelled", "n_live"),
                           "spatial": ("moran_i_unlabelled", "moran_i_labelled")},
    "image_absorption": {"mean": ("mean_absorption_fraction_score", "mean_full_absorption_score",
                                  "mean_num_split_features", "std_dev_absorption_fraction_score",
                                  "std_dev_full_absorption_score")},
    "image_unlearning": {"sae": ("unlearning_accuracy", "in_domain_retention", "cross_domain_retention"),
                         "negative_prompt": ("negative_prompt_unlearning_accuracy",
                                             "negative_prompt_in_domain_retention",
                                             "negative_prompt_cross_domain_retention"),
                         "activation_steering": ("activation_steering_unlearning_accuracy",
                                                 "activation_steering_in_domain_retention",
                                                 "activation_steering_cross_domain_retention")},
    "image_editing": {"riebench": ("success_at_preservation", "preservation_at_best", "min_preservation")},
}
DESCRIPTIONS = {
    "image_reconstruction": "EV, L0, dead latents; denoising loss recovered at the denoiser output and final latent "
                            "(the SAE spliced into the block during generation); the world's probe on spliced images",
    "image_sparse_probing": "top-k latents pooled over each object, logistic probe per attribute value (world "
                            "truth), against the raw update",
    "image_localisation": "share of a labelled feature's activation inside its objects (exact masks); Moran's I of "
                          "unlabelled features",
    "image_absorption": "SAEBench's feature absorption on the world's colour and shape values",
    "image_unlearning": "SAeUron's concept unlearning scored by the world's probe, against a negative prompt and "
                        "activation-difference steering",
    "image_editing": "RIEBench success at preservation >= 0.9 on the block alone",
}


def _category(name: str, eval_type: str) -> str | None:
    """The category of CATEGORIES whose pattern ({k}: a number, {attribute}: a word) the metric's name matches."""
    import re

    for category, patterns in CATEGORIES[eval_type].items():
        for pattern in patterns:
            regex = re.escape(pattern).replace(r"\{k\}", r"\d+").replace(r"\{attribute\}", r"[a-z_]+")
            if re.fullmatch(regex, name):
                return category
    return None


def metric_categories(eval_type: str, metrics: dict) -> dict[str, dict]:
    """The flat metrics of one eval laid out in SAEBench's categories (CATEGORIES); an unplaced metric is an
    error (a metric the schema would not describe)."""
    out: dict[str, dict] = {c: {} for c in CATEGORIES[eval_type]}
    for name, value in metrics.items():
        category = _category(name, eval_type)
        if category is None:
            raise ValueError(f"{eval_type} returned the metric {name!r}, which no category of its schema holds")
        out[category][name] = value
    return {c: v for c, v in out.items() if v}


def schema(eval_type: str) -> dict:
    """The JSON schema of an image eval's result: SAEBench's envelope, the metric categories as objects of numbers
    (or null), the details a list of objects."""
    number = {"anyOf": [{"type": "number"}, {"type": "null"}]}
    categories = {c: {"type": "object", "additionalProperties": number} for c in CATEGORIES[eval_type]}
    return {
        "title": f"{eval_type} (interp-workbench image SAEBench)", "type": "object",
        "required": ["eval_type_id", "eval_config", "eval_id", "datetime_epoch_millis", "eval_result_metrics",
                     "eval_result_details", "eval_result_unstructured", "sae_bench_commit_hash", "sae_lens_id",
                     "sae_lens_release_id", "sae_lens_version", "sae_cfg_dict"],
        "properties": {
            "eval_type_id": {"type": "string", "const": eval_type, "default": eval_type},
            "eval_config": {"type": "object"}, "eval_id": {"type": "string"},
            "datetime_epoch_millis": {"type": "integer"},
            "eval_result_metrics": {"type": "object", "properties": categories, "additionalProperties": False,
                                    "minProperties": 1},
            "eval_result_details": {"type": "array", "items": {"type": "object"}},
            "sae_bench_commit_hash": {"type": "string"}, "sae_lens_id": {"type": ["string", "null"]},
            "sae_lens_release_id": {"type": ["string", "null"]}, "sae_lens_version": {"type": ["string", "null"]},
            "sae_cfg_dict": {"type": ["object", "null"]}}}


def config_of(options: BenchOptions) -> ImageBenchConfig:
    """The eval's sizes from --option (bounded by saes.bench.image.LIMITS) and --seed / --batch-size."""
    kwargs = {name: options.get_int(name, getattr(ImageBenchConfig, name), *LIMITS[name])
              for name in ("n_images", "probe_images", "unlearn_images", "riebench_per_category")}
    return ImageBenchConfig(**kwargs, ks=options.get_ints("ks", ImageBenchConfig.ks, 1, 64),
                            multiplier=options.get_float("multiplier", ImageBenchConfig.multiplier, -10.0, 10.0),
                            seed=options.seed, batch_size=min(options.batch_size, LIMITS["batch_size"][1]))


def _details(eval_type: str, details: dict) -> tuple[list, dict]:
    """SAEBench's details are a list of objects: one per attribute value, feature or concept where the eval has
    them; everything else goes to eval_result_unstructured."""
    rows = []
    if eval_type == "image_sparse_probing":
        for attribute, entry in details["attributes"].items():
            rows += [{"attribute": attribute, "value": value, **row} for value, row in entry["values"].items()]
    elif eval_type == "image_localisation":
        rows = [{"feature": int(f), **row} for f, row in details["features"].items()]
    elif eval_type == "image_absorption":
        rows = [{"concept": c, **row} for c, row in details["values"].items()]
    elif eval_type == "image_unlearning":
        rows = [{"concept": c, **row} for c, row in details["concepts"].items()]
    rest = {k: v for k, v in details.items() if k not in ("attributes", "features", "values", "concepts")}
    return rows, rest


def _runner(eval_type: str):
    def run(sae, model, options: BenchOptions) -> EvalResult:
        config = config_of(options)
        name = f"{options.hook}"
        with tempfile.TemporaryDirectory() as work:
            result = run_image_evals(model, {name: (options.hook, sae)}, (eval_type,), config, work_dir=work)
        entry = result[name][eval_type]
        rows, rest = _details(eval_type, entry["details"])
        return EvalResult(config={**config.to_dict(), "eval_type": eval_type, "model_name": options.model_name,
                                  "block": options.hook},
                          metrics=metric_categories(eval_type, entry["metrics"]), details=rows,
                          unstructured={**rest, "description": DESCRIPTIONS[eval_type]})
    return run


def _checker(eval_type: str):
    def check(sae, model, options: BenchOptions) -> None:
        from interp.ground_truth import ground_truth_for

        config_of(options)  # every size bounded before any work
        if eval_type in TRUTH_EVALS:
            require_world(ground_truth_for(model), eval_type, getattr(model, "name", options.model_name))
        blocks = getattr(model, "blocks", {})
        if options.hook not in blocks:
            raise ValueError(f"{options.model_name} has no block {options.hook!r}; its blocks: {', '.join(blocks)}")
        if sae.cfg.d_in != blocks[options.hook].channels:
            raise ValueError(f"the SAE reads {sae.cfg.d_in} channels, {options.hook} of {options.model_name} has "
                             f"{blocks[options.hook].channels}: it was trained on another model or block")
    return check


for _eval_type in EVAL_TYPES:
    register_schema(_eval_type, schema(_eval_type))
    register_eval(EvalType(name=_eval_type, eval_type_id=_eval_type, run=_runner(_eval_type), kinds=("t2i",),
                           check=_checker(_eval_type), options=OPTIONS, description=DESCRIPTIONS[_eval_type]))
