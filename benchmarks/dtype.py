"""float32 against bfloat16 on every path where the workbench offers bf16, side by side in one run, interleaved.

    python benchmarks/dtype.py [--model smollm2-135m-instruct|toy-chat] [--only capture generation sae lora t2i
                               t2i-capture]
                               [--threads 2] [--out runs/benchmarks/dtype.json]

Each path runs both sides on the same inputs, alternating repeat by repeat, so that load from other
work on the machine hits both alike; it reports medians, their ratio, and what bf16 changes:

  capture     residuals at one hook (default: the middle layer's resid_post) of --capture-batches
              batches of corpus sequences. Three sides: `today` (float32, every layer, the final norm and
              the LM head run: forward_padded without stop_after), `truncated` (float32, the pass stops
              after the hooked layer: bit-identical, checked), `bf16` (bf16 weights + truncation).
              Change: per-token relative error |bf16 - fp32| / |fp32| (median, p99, max).
  generation  greedy completions (interp.models.generation.greedy_generate_tokens) of XSTest prompts in
              the chat template, float32 weights vs bf16 weights. Change: completions identical, and
              refusal verdicts (interp.lm_text.is_refusal) that agree.
  sae         TopK SAE steps (saes TopKTrainer) on the model's own residuals: float32 vs --autocast (the
              dense encoder product in bf16). Change: held-out explained variance after the same steps.
  lora        LoRA + VCL fine-tuning steps (flowlens.finetune.training_step) with a float32 vs a bf16 frozen
              base (adapters float32). Change: the loss at each step, and the float32 held-out loss of the
              two trained adapters.
  t2i         one-step generation of the embedded toy pipeline, float32 vs a bf16 pipeline. Change: the
              largest pixel difference (of 255).
  t2i-capture the toy's store collection (interp.collect.collect, --images images, --t2i-steps steps, float32)
              of each --t2i-block-sets entry (mid: mid_block.attentions.0; default: the toy's analysed blocks),
              `whole` (stop_after_last=False: every call runs the whole U-Net, then the last scheduler step)
              vs `truncated` (the default: the final call ends after the last hooked block). Change: none,
              checked (every stored tensor equal).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[0] = str(Path(__file__).resolve().parents[1])  # run from anywhere; the repo's packages first
import zoo  # noqa: F401,E402 - registers the embedded models with the core (interp.embedded)
from interp.hooks.lm import forward_padded, residual_capture, right_padded  # noqa: E402
from interp.lm_text import read_documents, token_sequences  # noqa: E402
from interp.models.lm import available_lms, load_lm  # noqa: E402

DOLLY = "/work/shared/data/dolly-sample.jsonl"
XSTEST = "/work/shared/data/xstest_prompts.csv"
PATHS = ("capture", "generation", "sae", "lora", "t2i", "t2i-capture")
MID = "mid_block.attentions.0"


def timed(fn):
    """(seconds, fn's result)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def interleaved(sides: dict, repeats: int, label: str) -> tuple[dict[str, list[float]], dict]:
    """Run every side once per repeat, in turn (after one untimed warm-up each); seconds per side and the
    last result of each."""
    seconds = {name: [] for name in sides}
    results = {}
    for repeat in range(repeats + 1):
        for name, run in sides.items():
            elapsed, results[name] = timed(run)
            if repeat > 0:
                seconds[name].append(elapsed)
        if repeat > 0:
            print(f"{label} {repeat}: " + ", ".join(f"{n} {seconds[n][-1]:.3f} s" for n in sides), flush=True)
    return seconds, results


def median(values) -> float:
    return statistics.median(values)


def relative_errors(approx: torch.Tensor, exact: torch.Tensor) -> dict:
    """Per-vector relative error |approx - exact| / |exact| over the last dimension: median, p99, max."""
    errors = ((approx.float() - exact).norm(dim=-1) / exact.norm(dim=-1).clamp_min(1e-12)).flatten()
    return {"median": float(errors.median()), "p99": float(errors.quantile(0.99)), "max": float(errors.max()),
            "n": errors.numel()}


# ----------------------------------------------------------------------------- capture

def bench_capture(args, lm32, lm16) -> tuple[dict, torch.Tensor]:
    hook = args.hook or f"blocks.{lm32.n_layers // 2}.hook_resid_post"
    sequences = token_sequences(lm32.tokenizer, read_documents(args.text), min(args.context, lm32.n_ctx))
    sequences = sequences[:args.capture_batches * args.batch_size]
    batches = [right_padded(lm32, sequences[b:b + args.batch_size]) for b in range(0, len(sequences), args.batch_size)]
    tokens = sum(int(mask.sum()) for _, mask in batches)

    def capture(lm, stop):
        out = []
        for ids, mask in batches:
            with residual_capture(lm, [hook]) as session:
                forward_padded(lm, ids, mask, stop_after=[hook] if stop else None)
            out.append(session.activations[hook][mask.bool()])
        return torch.cat(out)

    seconds, results = interleaved({"today": lambda: capture(lm32, False), "truncated": lambda: capture(lm32, True),
                                    "bf16": lambda: capture(lm16, True)}, args.repeats, "capture")
    tps = {name: tokens / median(times) for name, times in seconds.items()}
    result = {"hook": hook, "sequences": len(sequences), "context": args.context, "tokens": tokens,
              "seconds": seconds, "tokens_per_s": tps,
              "truncated_over_today": tps["truncated"] / tps["today"], "bf16_over_today": tps["bf16"] / tps["today"],
              "truncated_bit_identical": bool(torch.equal(results["truncated"], results["today"])),
              "bf16_relative_error": relative_errors(results["bf16"], results["today"])}
    return result, results["today"]


def capture_vectors(args, lm) -> torch.Tensor:
    """(tokens, d_model) float32 residuals at the capture hook of the capture path's corpus batches."""
    hook = args.hook or f"blocks.{lm.n_layers // 2}.hook_resid_post"
    sequences = token_sequences(lm.tokenizer, read_documents(args.text), min(args.context, lm.n_ctx))
    sequences = sequences[:args.capture_batches * args.batch_size]
    out = []
    for b in range(0, len(sequences), args.batch_size):
        ids, mask = right_padded(lm, sequences[b:b + args.batch_size])
        with residual_capture(lm, [hook]) as session:
            forward_padded(lm, ids, mask, stop_after=[hook])
        out.append(session.activations[hook][mask.bool()])
    return torch.cat(out)


# ----------------------------------------------------------------------------- generation

def bench_generation(args, lm32, lm16) -> dict:
    from flowlens.refusals import format_prompt, read_xstest_csv
    from interp.lm_text import is_refusal
    from interp.models.generation import greedy_generate_tokens
    from interp.models.lm import use_chat_template

    records = read_xstest_csv(args.prompts)[:args.generation_prompts]
    templated = use_chat_template(lm32.tokenizer, None)
    texts = [format_prompt(lm32.tokenizer, r.prompt, templated) for r in records]

    def run(lm):
        return greedy_generate_tokens(lm.model, lm.tokenizer, texts, max_new_tokens=args.max_new_tokens,
                                      batch_size=len(texts), add_special_tokens=not templated)

    seconds, results = interleaved({"float32": lambda: run(lm32), "bf16": lambda: run(lm16)}, args.repeats,
                                   "generation")
    counts = {name: sum(map(len, tokens)) for name, tokens in results.items()}
    tps = {name: counts[name] / median(times) for name, times in seconds.items()}
    decoded = {name: [lm32.tokenizer.decode(t, skip_special_tokens=True).strip() for t in tokens]
               for name, tokens in results.items()}
    verdicts = {name: [is_refusal(c) for c in completions] for name, completions in decoded.items()}
    same = sum(a == b for a, b in zip(results["float32"], results["bf16"]))
    agree = sum(a == b for a, b in zip(verdicts["float32"], verdicts["bf16"]))
    return {"prompts": len(texts), "max_new_tokens": args.max_new_tokens, "batch_size": len(texts),
            "chat_template": templated, "seconds": seconds, "generated_tokens": counts, "tokens_per_s": tps,
            "bf16_over_float32": tps["bf16"] / tps["float32"], "identical_completions": same,
            "refusal_verdicts_agree": agree, "refusals": {n: sum(v) for n, v in verdicts.items()}}


# ----------------------------------------------------------------------------- SAE training

def bench_sae(args, vectors: torch.Tensor) -> dict:
    from saes.train import TrainConfig
    from saes.trainers import make_trainer

    generator = torch.Generator().manual_seed(0)
    vectors = vectors[torch.randperm(len(vectors), generator=generator)]
    held_out, train = vectors[:args.sae_held_out], vectors[args.sae_held_out:]
    batches = [train[torch.randint(len(train), (args.sae_batch,), generator=generator)] for _ in range(args.sae_steps)]
    config = TrainConfig(d_in=vectors.shape[1], d_sae=args.d_sae, k=args.k, batch_size=args.sae_batch, lr=args.sae_lr)
    trainers = {"float32": make_trainer(config),
                "autocast": make_trainer(TrainConfig(**{**config.to_dict(), "autocast": True}))}
    for trainer in trainers.values():
        trainer.prepare(batches[0])
    seconds = {name: [] for name in trainers}
    for step, batch in enumerate(batches):
        for name, trainer in trainers.items():
            elapsed, _ = timed(lambda: trainer.step(batch))
            if step > 0:  # the first step of each is its warm-up
                seconds[name].append(elapsed)
        if step % 5 == 0 and step > 0:
            print(f"sae step {step}: " + ", ".join(f"{n} {seconds[n][-1]:.3f} s" for n in trainers if seconds[n]),
                  flush=True)

    def ev(trainer) -> float:
        sae = trainer.to_inference()
        with torch.no_grad():
            reconstruction = sae.decode(sae.encode(held_out))
        return 1 - float((reconstruction - held_out).pow(2).sum() / (held_out - held_out.mean(0)).pow(2).sum())

    sps = {name: args.sae_batch / median(times) for name, times in seconds.items()}
    evs = {name: ev(trainer) for name, trainer in trainers.items()}
    return {"d_in": vectors.shape[1], "d_sae": args.d_sae, "k": args.k, "batch_size": args.sae_batch,
            "steps": args.sae_steps, "lr": args.sae_lr, "held_out_vectors": len(held_out), "seconds": seconds,
            "samples_per_s": sps, "autocast_over_float32": sps["autocast"] / sps["float32"],
            "held_out_ev": evs, "ev_difference": evs["autocast"] - evs["float32"]}


# ----------------------------------------------------------------------------- LoRA + VCL

def bench_lora(args, lm32) -> dict:
    from peft import LoraConfig, get_peft_model

    from flowlens.finetune import frozen_weights_in, training_step
    from flowlens.sft_data import collate, tokenize_examples
    from flowlens.vcl import VCLConfig

    # a document's first 80 characters are the prompt, the rest (cut at --lora-length tokens) the completion
    rows = [(i, d[:80], d[80:]) for i, d in enumerate(read_documents(args.text)) if len(d) > 160][:2 * args.lora_batch]
    examples = tokenize_examples(rows, lm32.tokenizer, args.lora_length, False)
    pad_id = lm32.tokenizer.pad_token_id
    train_batch = collate(examples[:args.lora_batch], pad_id)
    held_out = collate(examples[args.lora_batch:2 * args.lora_batch], pad_id)
    vcl = VCLConfig(k=2, weight=1.0, window=(0.3, 0.5))
    window = vcl.check_against(args.lora_batch, lm32.d_model, lm32.n_layers)
    models, optimizers = {}, {}
    for name in ("float32", "bfloat16"):
        torch.manual_seed(0)  # the same adapter initialisation on both sides
        model = get_peft_model(copy.deepcopy(lm32.model), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                                     target_modules="all-linear", task_type="CAUSAL_LM"))
        model.train()
        models[name] = model
        optimizers[name] = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lora_lr)
    seconds = {name: [] for name in models}
    losses = {name: [] for name in models}
    for step in range(args.lora_steps + 1):
        for name, model in models.items():
            with frozen_weights_in(model, name, "cpu"):
                elapsed, totals = timed(lambda: training_step(model, optimizers[name], [train_batch], vcl, window))
            losses[name].append(totals)
            if step > 0:
                seconds[name].append(elapsed)
        print(f"lora step {step}: " + ", ".join(f"{n} loss {losses[n][-1]['loss']:.4f}" for n in models), flush=True)

    def float32_loss(model) -> float:
        model.eval()
        with torch.no_grad():
            return float(model(input_ids=held_out["input_ids"], attention_mask=held_out["attention_mask"],
                               labels=held_out["labels"]).loss)

    step_s = {name: median(times) for name, times in seconds.items()}
    return {"batch": args.lora_batch, "max_length": args.lora_length, "steps": args.lora_steps, "lr": args.lora_lr,
            "vcl_window_layers": window, "seconds": seconds, "median_step_s": step_s,
            "bf16_speedup": step_s["float32"] / step_s["bfloat16"], "losses": losses,
            "last_loss_difference": losses["bfloat16"][-1]["loss"] - losses["float32"][-1]["loss"],
            "float32_held_out_loss": {name: float32_loss(model) for name, model in models.items()}}


# ----------------------------------------------------------------------------- toy generation

def bench_t2i(args) -> dict:
    import numpy as np

    from interp.ground_truth import world
    from interp.models import load_t2i

    prompts = world("shapes").prompts(args.images, 0)
    pipes = {"float32": load_t2i("toy", device="cpu", dtype=torch.float32),
             "bf16": load_t2i("toy", device="cpu", dtype=torch.bfloat16)}
    seeds = list(range(len(prompts)))
    seconds, results = interleaved({name: (lambda m=m: m.generate(prompts, seed=seeds, output_type="np"))
                                    for name, m in pipes.items()}, args.repeats, "t2i")
    a, b = (np.asarray(results[n], dtype=np.float64) for n in ("float32", "bf16"))
    ips = {name: len(prompts) / median(times) for name, times in seconds.items()}
    difference = np.abs(np.round(a * 255) - np.round(b * 255))
    return {"images": len(prompts), "seconds": seconds, "images_per_s": ips,
            "bf16_over_float32": ips["bf16"] / ips["float32"], "max_pixel_difference_of_255": float(difference.max()),
            "mean_pixel_difference_of_255": float(difference.mean())}


def bench_t2i_capture(args) -> dict:
    import tempfile

    from interp.collect import CollectionPlan, collect
    from interp.ground_truth import world
    from interp.models import load_t2i
    from interp.store import ActivationStore

    model = load_t2i("toy", device="cpu", dtype=torch.float32)
    prompts = world("shapes").prompts(args.images, 0)
    out = {"images": len(prompts), "steps": args.t2i_steps, "sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.t2i_block_sets:
            blocks = [MID] if name == "mid" else list(model.default_blocks)
            runs = {"whole": 0, "truncated": 0}

            def run(stop: bool, side: str, blocks=blocks, name=name, runs=runs):
                runs[side] += 1
                plan = CollectionPlan(model="toy", blocks=blocks, prompts=prompts, seeds=list(range(len(prompts))),
                                      steps=args.t2i_steps, guidance=0.0, images_per_shard=len(prompts))
                path = Path(tmp) / f"{name}-{side}-{runs[side]}"
                collect(model, plan, path, progress=False, stop_after_last=stop)
                return path

            seconds, results = interleaved({"whole": lambda: run(False, "whole"),
                                            "truncated": lambda: run(True, "truncated")}, args.repeats,
                                           f"t2i-capture {name}")
            whole, cut = (ActivationStore(results[side]) for side in ("whole", "truncated"))
            identical = all(torch.equal(whole.image(i, b), cut.image(i, b)) for b in blocks for i in range(len(whole)))
            ips = {side: len(prompts) / median(times) for side, times in seconds.items()}
            out["sets"][name] = {"blocks": blocks, "seconds": seconds, "images_per_s": ips,
                                 "truncated_over_whole": ips["truncated"] / ips["whole"],
                                 "bit_identical": identical}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: smollm2-135m-instruct when fetched, else toy-chat")
    parser.add_argument("--only", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--text", default=DOLLY, help="corpus for capture, SAE and LoRA (JSONL or text)")
    parser.add_argument("--prompts", default=XSTEST, help="XSTest CSV for generation")
    parser.add_argument("--hook", default=None, help="capture hook (default: the middle layer's resid_post)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each side, after one warm-up")
    parser.add_argument("--capture-batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16, help="capture: sequences per forward pass")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--generation-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--d-sae", type=int, default=4608)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--sae-batch", type=int, default=2048)
    parser.add_argument("--sae-steps", type=int, default=16)
    parser.add_argument("--sae-lr", type=float, default=4e-4)
    parser.add_argument("--sae-held-out", type=int, default=1024)
    parser.add_argument("--lora-batch", type=int, default=8)
    parser.add_argument("--lora-length", type=int, default=64)
    parser.add_argument("--lora-steps", type=int, default=4)
    parser.add_argument("--lora-lr", type=float, default=1e-3)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--t2i-steps", type=int, default=1, help="t2i-capture: denoising steps")
    parser.add_argument("--t2i-block-sets", nargs="+", choices=("mid", "default"), default=["mid", "default"],
                        help="t2i-capture: mid_block.attentions.0 alone, and/or the toy's analysed blocks")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="runs/benchmarks/dtype.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or ("smollm2-135m-instruct" if "smollm2-135m-instruct" in available_lms() else "toy-chat")
    result = {"model": model, "threads": args.threads, "torch": torch.__version__, "repeats": args.repeats}
    lm_paths = {"capture", "generation", "sae", "lora"} & set(args.only)
    if lm_paths:
        lm32 = load_lm(model, dtype=torch.float32)
        lm16 = load_lm(model, dtype=torch.bfloat16) if {"capture", "generation"} & lm_paths else None
        vectors = None
        if "capture" in args.only:
            result["capture"], vectors = bench_capture(args, lm32, lm16)
            c = result["capture"]
            print(f"capture {c['tokens']} tokens at {c['hook']}: today {c['tokens_per_s']['today']:.0f} tok/s, "
                  f"truncated {c['truncated_over_today']:.2f}x (bit-identical: {c['truncated_bit_identical']}), "
                  f"bf16 + truncated {c['bf16_over_today']:.2f}x; relative error {c['bf16_relative_error']}")
        elif "sae" in args.only:  # the SAE's data alone: float32 residuals of the same corpus batches
            vectors = capture_vectors(args, lm32)
        if "generation" in args.only:
            result["generation"] = g = bench_generation(args, lm32, lm16)
            print(f"generation {g['prompts']} prompts: float32 {g['tokens_per_s']['float32']:.0f} tok/s, bf16 "
                  f"{g['bf16_over_float32']:.2f}x; identical {g['identical_completions']}/{g['prompts']}, verdicts "
                  f"agree {g['refusal_verdicts_agree']}/{g['prompts']}")
        if "sae" in args.only:
            result["sae"] = s = bench_sae(args, vectors)
            print(f"SAE {s['d_in']} -> {s['d_sae']}, k {s['k']}, batch {s['batch_size']}: float32 "
                  f"{s['samples_per_s']['float32']:.0f}/s, autocast {s['autocast_over_float32']:.2f}x; held-out EV "
                  f"{s['held_out_ev']['float32']:.4f} vs {s['held_out_ev']['autocast']:.4f} after {s['steps']} steps")
        if "lora" in args.only:
            result["lora"] = lo = bench_lora(args, lm32)
            print(f"LoRA + VCL {lo['batch']} x {lo['max_length']}: float32 {lo['median_step_s']['float32']:.2f} s a "
                  f"step, bf16 base {lo['bf16_speedup']:.2f}x; loss difference at the last step "
                  f"{lo['last_loss_difference']:+.4f}; float32 held-out loss {lo['float32_held_out_loss']}")
    if "t2i" in args.only:
        result["t2i"] = t = bench_t2i(args)
        print(f"toy generation {t['images']} images: float32 {t['images_per_s']['float32']:.1f} img/s, bf16 "
              f"{t['bf16_over_float32']:.2f}x; max pixel difference {t['max_pixel_difference_of_255']:.0f}/255")
    if "t2i-capture" in args.only:
        result["t2i_capture"] = tc = bench_t2i_capture(args)
        for name, r in tc["sets"].items():
            print(f"toy store collection, {tc['images']} images, {tc['steps']} step(s), {name} blocks: whole "
                  f"{r['images_per_s']['whole']:.1f} img/s, truncated {r['truncated_over_whole']:.2f}x "
                  f"(bit-identical: {r['bit_identical']})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
