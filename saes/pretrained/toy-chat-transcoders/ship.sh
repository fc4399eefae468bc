#!/usr/bin/env bash
# How the toy-chat transcoders in this directory were made (one per layer: 4), run from the repository root.
# Corpus: the toy-chat SAE's (saes/pretrained/toy-chat/ship.sh): chat-world conversations of the train split (60%
# general, 20% harmful with refusals, 20% benign-but-sounding-harmful) in the model's chat template, here the
# first 300,000 tokens (of 20,000 conversations); held out: 2,000 conversations of the held-out split (the fidelity below).
# Each layer's transcoder reads the MLP's input (blocks.L.mlp.hook_in: resid_mid after ln_2, as the MLP
# reads it) and writes its output (blocks.L.mlp.hook_out); BatchTopK training, saved as sae-lens'
# jumprelu_transcoder (sae_lens.SAE.load_from_disk loads it). The shipped run collected the same tensors under the
# hook names of an earlier draft (blocks.L.ln2.hook_normalized, blocks.L.hook_mlp_out), renamed in the cfg.json
# metadata after training; the weights are as trained. Wall time on a loaded 2-core machine: about 15 minutes per
# layer (the layers train independently; three ran side by side).
set -euo pipefail
RUN=${RUN:-runs/lm_ship/toy-chat-transcoders}
OUT=${OUT:-saes/pretrained/toy-chat-transcoders}
THREADS=${THREADS:-1}
MODEL=toy-chat
LAYERS="0 1 2 3"
mkdir -p "$RUN"
python - "$RUN" <<'PY'
import json, sys
from interp.models.lm import load_hf_lm
from zoo.chat.world import World, WorldConfig

run = sys.argv[1]
_, tokenizer = load_hf_lm("toy-chat")
world = World(WorldConfig(seed=0))
for name, split, n in (("corpus", "train", 20000), ("heldout", "held_out", 2000)):
    with open(f"{run}/{name}.jsonl", "w") as out:
        for row in world.mixture(split, n, {"general": 0.6, "harmful": 0.2, "benign": 0.2}, seed=7):
            chat = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
            text = tokenizer.apply_chat_template(chat, tokenize=False)
            if tokenizer.bos_token and text.startswith(tokenizer.bos_token):  # collect adds the start token itself
                text = text[len(tokenizer.bos_token):]
            out.write(json.dumps({"text": text}) + "\n")
PY
HOOKS=""
for L in $LAYERS; do HOOKS="$HOOKS blocks.$L.mlp.hook_in blocks.$L.mlp.hook_out"; done
python -m interp collect --model "$MODEL" --hooks $HOOKS --text "$RUN/corpus.jsonl" --threads "$THREADS" \
    --max-tokens 300000 --out "$RUN/store"
for L in $LAYERS; do
  python -m saes train --store "$RUN/store" --block "blocks.$L.mlp.hook_in" \
      --target-block "blocks.$L.mlp.hook_out" --architecture batchtopk-transcoder --out "$RUN/tc/layer$L" \
      --d-sae 1024 --k 16 --tokens 1200000 --batch-size 4096 --lr 2e-3 --dead-after-tokens 500000 \
      --threads "$THREADS" --restart
  mkdir -p "$OUT/blocks.$L.mlp.hook_in"
  cp "$RUN/tc/layer$L/cfg.json" "$RUN/tc/layer$L/sae_weights.safetensors" "$RUN/tc/layer$L/train_summary.json" \
      "$OUT/blocks.$L.mlp.hook_in/"
done
python -m saes transcoder-eval --model "$MODEL" --transcoders "$OUT" --text "$RUN/heldout.jsonl" --tokens 20000 \
    --out "$OUT/fidelity.json" --overwrite
