#!/usr/bin/env bash
# How the SmolLM2-135M-Instruct transcoders in this directory were made (one per layer: 30), run from the
# repository root after `python -m interp fetch smollm2-135m-instruct`.
# Corpus: the SmolLM2 SAE's (saes/pretrained/smollm2/ship.sh): the SmolLM2 study's Dolly train records and AdvBench
# goals with templated refusals, each rendered as a chat by the model's own template, whole documents (cut to ~1,016
# tokens), in a fixed shuffled order; the first 68,210 tokens are read, 16 chunks (CPU time on a 2-core machine shared by 7 jobs: the run began with
# --tokens 160000, was resumed after its 8th chunk with 80000 and after its 12th with 68210, the token count of 16
# chunks; the chunks are the same whole-document ranges either way, so the result is the same as one run with 68210). Held out: the study's 200 held-out Dolly
# records (the fidelity below).
# All 30 layers train side by side (`saes train-transcoders`): each chunk of ~4,096 tokens of whole documents runs
# through the model once, every layer's MLP input (blocks.L.mlp.hook_in) and output (blocks.L.mlp.hook_out) are
# recorded (the start token left out), and each layer's BatchTopK transcoder takes two shuffled passes over the
# chunk (so 136,420 training tokens a layer, 68,210 distinct). One thread. Checkpoints per layer every 4 chunks;
# the same command resumes. Shipped in float16 (30 x 2.4 MB); the fidelity is measured on the float16 files.
set -euo pipefail
RUN=${RUN:-runs/lm_ship/smollm2-transcoders}
OUT=${OUT:-saes/pretrained/smollm2-transcoders}
THREADS=${THREADS:-1}
MODEL=smollm2-135m-instruct
CONTEXT=1024
DATA_DIR=${DATA_DIR:-../shared/data}
mkdir -p "$RUN"
python -m experiments.smollm2_study data --data-dir "$DATA_DIR"
python - "$RUN" "$CONTEXT" <<'PY'
import json, random, sys
from flowlens.diversity import read_jsonl
from interp.models.lm import load_hf_lm

run, context = sys.argv[1], int(sys.argv[2])
_, tokenizer = load_hf_lm("smollm2-135m-instruct")
data = "runs/experiments/smollm2/data"
for name, sources in (("corpus", ("dolly-train", "safety")), ("heldout", ("dolly-heldout",))):
    texts = []
    for source in sources:
        for _, row in read_jsonl(f"{data}/{source}.jsonl"):
            chat = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
            text = tokenizer.apply_chat_template(chat, tokenize=False)
            if tokenizer.bos_token and text.startswith(tokenizer.bos_token):  # the trainer adds the start token
                text = text[len(tokenizer.bos_token):]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= context:
                text = tokenizer.decode(ids[:context - 8])
            texts.append(text)
    random.Random(0).shuffle(texts)
    with open(f"{run}/{name}.jsonl", "w") as out:
        out.writelines(json.dumps({"text": t}) + "\n" for t in texts)
PY
if [ "${SKIP_TRAIN:-0}" != 1 ]; then
OMP_NUM_THREADS=$THREADS python -m saes train-transcoders --model "$MODEL" --text "$RUN/corpus.jsonl" \
    --out "$RUN/tc" --architecture batchtopk-transcoder --d-sae 1024 --k 32 --batch-size 1024 --lr 2e-3 \
    --tokens 68210 --epochs 2 --chunk-tokens 4096 --dead-after-tokens 100000 --context "$CONTEXT" \
    --checkpoint-every-chunks 4 --threads "$THREADS"
fi
for L in $(seq 0 29); do
  mkdir -p "$OUT/blocks.$L.mlp.hook_in"
  python -c "import sys; from saes.sae import SAE; SAE.load(sys.argv[1]).astype('float16').save(sys.argv[2])" \
      "$RUN/tc/blocks.$L.mlp.hook_in" "$OUT/blocks.$L.mlp.hook_in"
  cp "$RUN/tc/blocks.$L.mlp.hook_in/train_summary.json" "$OUT/blocks.$L.mlp.hook_in/"
done
OMP_NUM_THREADS=$THREADS python -m saes transcoder-eval --model "$MODEL" --transcoders "$OUT" \
    --text "$RUN/heldout.jsonl" --tokens 10000 --context "$CONTEXT" --per-layer-tokens 1000 --threads "$THREADS" \
    --out "$OUT/fidelity.json" --overwrite
