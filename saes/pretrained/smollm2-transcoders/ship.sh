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
# The JumpReLU thresholds BatchTopK tracked in 128 steps (a running mean from the untrained encoder's) let ~300 of
# 1024 features fire per token at inference instead of k = 32: each layer's threshold is set so that 32 fire on
# average over the corpus' first ~5,000 tokens (saes.transcoder_set.calibrate_thresholds), then saved in float16.
OMP_NUM_THREADS=$THREADS python - "$RUN" "$OUT" <<'PY'
import sys
import zoo  # noqa: F401
from interp.lm_text import read_documents, token_sequences
from interp.models.lm import load_lm
from saes.sae import SAE
from saes.transcoder_set import calibrate_thresholds

run, out = sys.argv[1], sys.argv[2]
lm = load_lm("smollm2-135m-instruct")
sample, n = [], 0
for s in token_sequences(lm.tokenizer, read_documents(f"{run}/corpus.jsonl"), 1024):
    if len(s) >= 2:
        sample.append(s)
        n += len(s) - 1
    if n >= 4096:
        break
transcoders = {L: SAE.load(f"{out}/blocks.{L}.mlp.hook_in") for L in range(lm.n_layers)}
print(calibrate_thresholds(lm, transcoders, sample, k=32))
for L, tc in transcoders.items():
    tc.astype("float16").save(f"{out}/blocks.{L}.mlp.hook_in")
PY
OMP_NUM_THREADS=$THREADS python -m saes transcoder-eval --model "$MODEL" --transcoders "$OUT" \
    --text "$RUN/heldout.jsonl" --tokens 4000 --context "$CONTEXT" --threads "$THREADS" \
    --out "$OUT/fidelity.json" --overwrite
