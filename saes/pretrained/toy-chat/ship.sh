#!/usr/bin/env bash
# How the toy-chat SAE in this directory was made (about 18 minutes on one thread of a busy 2-core machine); run from
# the repository root.
# Corpus: 40,000 chat-world conversations of the train split (60% general tasks, 20% harmful requests with
# their refusals, 20% benign requests that sound harmful), each rendered by the model's chat template;
# held out: 2,000 conversations of the held-out split. One mid layer (1 of 4, the toy VCL window), resid_post.
set -euo pipefail
RUN=${RUN:-runs/lm_ship/toy-chat}
OUT=${OUT:-saes/pretrained/toy-chat}
THREADS=${THREADS:-2}
HOOK=blocks.1.hook_resid_post
MODEL=toy-chat
mkdir -p "$RUN"
python - "$RUN" <<'PY'
import json, sys
from interp.models.lm import load_hf_lm
from zoo.chat.world import World, WorldConfig

run = sys.argv[1]
_, tokenizer = load_hf_lm("toy-chat")
world = World(WorldConfig(seed=0))
for name, split, n in (("corpus", "train", 40000), ("heldout", "held_out", 2000)):
    with open(f"{run}/{name}.jsonl", "w") as out:
        for row in world.mixture(split, n, {"general": 0.6, "harmful": 0.2, "benign": 0.2}, seed=7):
            chat = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
            text = tokenizer.apply_chat_template(chat, tokenize=False)
            if tokenizer.bos_token and text.startswith(tokenizer.bos_token):  # collect adds the start token itself
                text = text[len(tokenizer.bos_token):]
            out.write(json.dumps({"text": text}) + "\n")
PY
python -m interp collect --model "$MODEL" --hooks "$HOOK" --text "$RUN/corpus.jsonl" --threads "$THREADS" \
    --out "$RUN/store"
python -m saes train --store "$RUN/store" --block "$HOOK" --out "$RUN/sae" --d-sae 1024 --k 16 \
    --tokens 5000000 --batch-size 4096 --lr 1e-3 --threads "$THREADS"
mkdir -p "$OUT/$HOOK"
cp "$RUN/sae/cfg.json" "$RUN/sae/sae_weights.safetensors" "$RUN/sae/train_summary.json" "$OUT/$HOOK/"
python -c "import sys; from saes.sae import SAE; SAE.load(sys.argv[1]).astype('float16').save(sys.argv[1])" \
    "$OUT/$HOOK"  # shipped in fp16; the evaluation and cards below measure the fp16 weights
python -m saes eval --sae "$OUT/$HOOK" --model "$MODEL" --text "$RUN/heldout.jsonl" --tokens 20000 \
    --out "$OUT/$HOOK/eval.json" --overwrite
python -m saes features --sae "$OUT/$HOOK" --model "$MODEL" --text "$RUN/corpus.jsonl" --tokens 100000 \
    --out "$OUT/$HOOK" --overwrite
