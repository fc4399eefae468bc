"""SAEBench's output envelope (sae-bench 0.6.0), its JSON schemas, and the one writer of bench results.

Every SAEBench eval writes one JSON object per SAE and eval type with the fields of
`sae_bench.evals.base_eval_output.BaseEvalOutput`:

    eval_type_id, eval_config, eval_id (a UUID), datetime_epoch_millis, eval_result_metrics (categories ->
    flat metrics), eval_result_details (a list of objects), eval_result_unstructured, sae_bench_commit_hash,
    sae_lens_id, sae_lens_release_id, sae_lens_version, sae_cfg_dict

`envelope` builds that object; `validate` checks it against the JSON schema file the sae-bench wheel carries for
its eval type (`sae_bench/evals/<eval>/eval_output_schema_<id>.json`, found in the installed package: install it
with `pip install --no-deps sae-bench==0.6.0`, as requirements-anchors.txt says); `write_result` refuses shipped
outputs (unless overwrite), validates, and writes strict JSON atomically.

Fields that name SAEBench or sae-lens say what ran here: sae_bench_commit_hash is "interp-workbench@<commit>"
(this project's code computed the numbers, with SAEBench 0.6.0's formulas), sae_lens_release_id is
"interp-workbench" and sae_lens_id the SAE's directory name (SAEBench names a custom SAE the same way: a release
and an id of one's own), and sae_lens_version the version recorded in the SAE's cfg.json (None if none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from functools import lru_cache
from pathlib import Path

SAEBENCH_VERSION = "0.6.0"
ENVELOPE_FIELDS = ("eval_type_id", "eval_config", "eval_id", "datetime_epoch_millis", "eval_result_metrics",
                   "eval_result_details", "eval_result_unstructured", "sae_bench_commit_hash", "sae_lens_id",
                   "sae_lens_release_id", "sae_lens_version", "sae_cfg_dict")
RELEASE_ID = "interp-workbench"
INSTALL_HINT = f"pip install --no-deps sae-bench=={SAEBENCH_VERSION}"


class SchemaError(ValueError):
    """A bench result that does not match SAEBench's schema for its eval type, or an eval type it has none for."""


@lru_cache(maxsize=1)
def project_commit() -> str:
    """This checkout's commit (short), or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def sae_cfg_dict(sae, hook: str | None = None, model_name: str | None = None) -> dict:
    """The SAE's cfg.json as a dict, with sae-lens' top-level names SAEBench's plots read (hook_name, hook_layer,
    model_name, architecture, d_in, d_sae, k) lifted out of our metadata."""
    cfg = sae.cfg.to_sae_lens_dict()
    metadata = dict(cfg.get("metadata") or {})
    hook = hook or metadata.get("hook_name")
    cfg["hook_name"] = hook
    layer = None
    if hook and hook.startswith("blocks."):
        part = hook.split(".")[1]
        layer = int(part) if part.isdigit() else None
    cfg["hook_layer"] = layer
    cfg["model_name"] = model_name or metadata.get("model_name")
    return cfg


def envelope(eval_type_id: str, eval_config: dict, metrics: dict, details: list | None = None,
             unstructured=None, *, sae=None, sae_name: str | None = None, hook: str | None = None,
             model_name: str | None = None) -> dict:
    """One SAEBench result object (the fields of BaseEvalOutput, in its order)."""
    cfg = sae_cfg_dict(sae, hook, model_name) if sae is not None else None
    version = (cfg or {}).get("metadata", {}).get("sae_lens_version") if cfg else None
    return {
        "eval_type_id": eval_type_id,
        "eval_config": eval_config,
        "eval_id": str(uuid.uuid4()),
        "datetime_epoch_millis": int(time.time() * 1000),
        "eval_result_metrics": metrics,
        "eval_result_details": list(details or []),
        "eval_result_unstructured": unstructured,
        "sae_bench_commit_hash": f"interp-workbench@{project_commit()}",
        "sae_lens_id": sae_name,
        "sae_lens_release_id": RELEASE_ID,
        "sae_lens_version": version,
        "sae_cfg_dict": cfg,
    }


def schema_dir() -> Path | None:
    """sae_bench/evals of the installed sae-bench wheel (None when it is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("sae_bench")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "evals"


@lru_cache(maxsize=1)
def schemas() -> dict[str, dict]:
    """eval_type_id -> the JSON schema the sae-bench wheel carries for it (its `eval_type_id` default names the
    type). An ImportError when sae-bench is not installed."""
    root = schema_dir()
    if root is None:
        raise ImportError(f"sae-bench is not installed, so bench results cannot be checked against its schemas: "
                          f"{INSTALL_HINT}")
    found = {}
    for path in sorted(root.glob("*/eval_output_schema_*.json")):
        schema = json.loads(path.read_text())
        type_id = schema.get("properties", {}).get("eval_type_id", {}).get("default")
        if type_id:
            found[type_id] = schema
    return found


# eval_type_id -> the schema of an eval type of this project's own that sae-bench has none for (the image evals,
# saes/bench/evals/image.py): SAEBench's envelope, validated without the wheel
LOCAL_SCHEMAS: dict[str, dict] = {}


def register_schema(type_id: str, schema: dict) -> None:
    """The JSON schema of an eval type sae-bench does not have (`validate` uses it, with or without the wheel)."""
    LOCAL_SCHEMAS[type_id] = schema


def validate(result: dict) -> None:
    """Check one result against SAEBench's schema for its eval_type_id; a SchemaError naming the first problem."""
    import jsonschema

    missing = [name for name in ENVELOPE_FIELDS if name not in result]
    if missing:
        raise SchemaError(f"the result lacks SAEBench's field(s) {', '.join(missing)}")
    type_id = result["eval_type_id"]
    known = {**LOCAL_SCHEMAS, **schemas()} if type_id not in LOCAL_SCHEMAS else LOCAL_SCHEMAS
    if type_id not in known:
        raise SchemaError(f"sae-bench {SAEBENCH_VERSION} has no schema for eval type {type_id!r}; it has: "
                          f"{', '.join(sorted(known))}")
    try:
        jsonschema.validate(result, known[type_id])
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "the top level"
        raise SchemaError(f"{type_id} result does not match sae-bench's schema at {where}: {err.message}") from None


def check_or_note(result: dict) -> bool:
    """Validate when sae-bench is installed or the eval type is this project's own (True); else a note on stderr
    and False."""
    if result.get("eval_type_id") in LOCAL_SCHEMAS:
        validate(result)
        return True
    try:
        schemas()
    except ImportError as err:
        print(f"note: {err}", file=sys.stderr)
        return False
    validate(result)
    return True


def write_result(path: str | os.PathLike, result: dict, overwrite: bool = False) -> Path:
    """Validate `result` and write it as strict JSON, atomically; a shipped path is refused unless overwrite."""
    from interp.shipped import refuse_shipped

    from ..strict_json import write_json

    path = Path(path)
    if not overwrite:
        refuse_shipped([path], "saes bench")
    check_or_note(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result, indent=2)
    return path


def result_path(out_dir: str | os.PathLike, sae_name: str, eval_name: str) -> Path:
    """SAEBench's layout: <out>/<eval>/<release>_<sae id>_eval_results.json."""
    return Path(out_dir) / eval_name / f"{RELEASE_ID}_{sae_name}_eval_results.json"


__all__ = ["ENVELOPE_FIELDS", "INSTALL_HINT", "LOCAL_SCHEMAS", "RELEASE_ID", "SAEBENCH_VERSION", "SchemaError",
           "check_or_note", "envelope", "project_commit", "register_schema", "result_path", "sae_cfg_dict",
           "schema_dir", "schemas", "validate", "write_result"]
