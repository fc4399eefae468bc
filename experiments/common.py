"""What both sweeps share: the held-out evaluation prompts, the measurements of one model, and table helpers.

Every model is measured the same way, so the safety-ratio sweep (issue 6) and the VCL sweep
(issue 7) report comparable numbers:

- refusals (``flowlens.refusals``): greedy completions of held-out chat-world prompts in the chat
  template; false-refusal rate on benign prompts that only sound dangerous, refusal rate on
  harmful prompts, exact-match task accuracy on general prompts;
- geometry (``flowlens.geometry``): residuals at the last prompt token of every layer (through
  ``interp``) on a fixed set of held-out prompts; top-k energy, effective rank and participation
  ratio per layer, and the structural alignment score (|cos| of each layer's k-th principal
  direction with the base model's) per layer.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from interp.atomic import atomic_write_text
from zoo.chat.world import GENERAL_TASKS, World, WorldConfig

REPO = Path(__file__).resolve().parent.parent
BASE_MODEL = REPO / "zoo" / "weights" / "chat-base"
SHIPPED_WEIGHTS = REPO / "zoo" / "weights"
RESULTS = REPO / "experiments" / "results"
N_COMPONENTS = 3   # principal directions compared and top-k energy's k (the study's default)
EVAL_SEED = 11     # held-out evaluation prompts (disjoint from training by the world's split)
GEOMETRY_SEED = 13


# The code a measured cell depends on: a cell is current when the hash of these files is the one it records.
MEASURE_CODE = ("experiments/common.py", "flowlens/finetune.py", "flowlens/vcl.py", "flowlens/refusals.py",
                "flowlens/geometry.py", "interp/models/generation.py", "interp/models/lm.py",
                "interp/models/language_model.py", "interp/models/spec.py", "interp/models/protocol.py",
                "interp/names.py", "interp/hooks/lm.py",
                "interp/hooks/scoped.py", "interp/lm_text.py", "zoo/chat/world.py")  # lm_text: the refusal
# detector and the prompt stripping; scoped: the hook session every capture is; spec: where a name loads from
# (`ModelSpec.locate`); protocol: the view of a bare model the hooks take (`lm_form`); names: the LM hook names


def code_fingerprint(*extra: str) -> str:
    """sha256 (16 hex digits) of the source files a cell's numbers depend on (``MEASURE_CODE`` + ``extra``,
    paths relative to the repository)."""
    digest = hashlib.sha256()
    for name in sorted(set(MEASURE_CODE) | set(extra)):
        digest.update(name.encode() + b"\0" + (REPO / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def provenance(result: dict, fingerprint: str) -> str:
    """``"computed"`` (by this code, in this run directory), ``"carried over"`` (restored from a committed
    report, computed by this same code) or ``"stale"`` (computed by other code, or before cells recorded it)."""
    if result.get("code") != fingerprint:
        return "stale"
    return "carried over" if result.get("restored_from") else "computed"


def eval_records(per_task: int = 12, n_harmful: int = 120, n_benign: int = 120, world_seed: int = 0) -> list[dict]:
    """Held-out prompt set in FlowLens' JSONL layout: ``{"prompt", "kind", "type", "answer"?}``."""
    world = World(WorldConfig(seed=world_seed))
    records = [{"prompt": e["prompt"], "kind": "general", "type": e["type"], "answer": e["completion"]}
               for task in GENERAL_TASKS for e in world.sample("general", "held_out", per_task, EVAL_SEED, type=task)]
    for kind, n in (("harmful", n_harmful), ("benign", n_benign)):
        records += [{"prompt": e["prompt"], "kind": kind, "type": e["type"]}
                    for e in world.sample(kind, "held_out", n, EVAL_SEED)]
    return records


def geometry_prompts(n_each: int = 64, world_seed: int = 0) -> list[str]:
    """Held-out prompts of every kind (benign, harmful, general), the same for every model."""
    world = World(WorldConfig(seed=world_seed))
    return [e["prompt"] for kind in ("benign", "harmful", "general")
            for e in world.sample(kind, "held_out", n_each, GEOMETRY_SEED)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_json(path: Path, obj) -> None:
    """Atomic: a sweep interrupted mid-write never leaves a half result that looks finished."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def refusal_metrics(model, tokenizer, records: list[dict]) -> dict:
    """False-refusal, harmful-refusal and task-accuracy rates of a loaded HF model on ``records``."""
    from flowlens.refusals import PromptRecord, evaluate_refusals

    prompts = [PromptRecord(r["prompt"], r["kind"], r.get("answer"), r.get("type")) for r in records]
    evaluation = evaluate_refusals(model, tokenizer, prompts, max_new_tokens=40, batch_size=64, chat_template=True)
    metrics = evaluation.metrics.to_json()
    metrics["examples"] = evaluation.rows[::max(1, len(evaluation.rows) // 12)]  # a few, to read what it says
    return metrics


def last_token_residuals(model_dir: str | Path, prompts: list[str]) -> np.ndarray:
    """``(N, L, d)`` resid_post at the last prompt token (chat template), through ``interp``."""
    from interp.hooks.lm import last_token_residuals as capture
    from interp.models.lm import load_lm

    lm = load_lm(str(model_dir))
    return capture(lm, prompts, chat_template=True, batch_size=64).numpy()


def reference_residuals(run_root: Path) -> np.ndarray:
    """The base model's last-token residuals on the geometry prompts, computed once per experiment."""
    path = run_root / "base_residuals.npy"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, last_token_residuals(BASE_MODEL, geometry_prompts()))
    return np.load(path)


def geometry_metrics(residuals: np.ndarray, reference: np.ndarray | None) -> dict:
    """Concentration per layer and (with a reference) the structural alignment score per layer."""
    from flowlens.geometry import concentration_by_layer, structural_alignment

    out = {"concentration": concentration_by_layer(residuals, N_COMPONENTS)}
    if reference is not None:
        alignment = structural_alignment(residuals, reference, N_COMPONENTS)
        score = alignment["score"]  # (L, k)
        out["alignment"] = {"per_layer_pc": score.tolist(), "depth": alignment["depth"].tolist(),
                            "pc1_by_layer": score[:, 0].tolist(), "mean_by_layer": score.mean(1).tolist(),
                            "mean": float(score.mean())}
    return out


def measure_model(model_dir: str | Path, records: list[dict], prompts: list[str],
                  reference_residuals: np.ndarray | None) -> dict:
    """Refusal metrics and geometry of the saved model in ``model_dir``."""
    from interp.models.lm import load_hf_lm

    model, tokenizer = load_hf_lm(str(model_dir))
    result = {"refusals": refusal_metrics(model, tokenizer, records)}
    result["geometry"] = geometry_metrics(last_token_residuals(model_dir, prompts), reference_residuals)
    return result


# --------------------------------------------------------------------------- summaries

def mean_spread(values: list[float | None]) -> dict:
    """Mean, sample standard deviation (0 for one value), min, max and n of the finite values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(xs), "max": max(xs), "n": len(xs)}


def show(stat: dict, digits: int = 3) -> str:
    """``mean ± std`` (or the single value when n = 1) for a markdown table."""
    if stat["mean"] is None:
        return "n/a"
    if stat["n"] == 1:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
