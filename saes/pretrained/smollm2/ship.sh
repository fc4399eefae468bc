#!/usr/bin/env bash
# How the SmolLM2-135M-Instruct SAE in this directory was made; run from the repository root after
# `python -m interp fetch smollm2-135m-instruct`. Corpus: the SmolLM2 study's training text (Dolly train
# records and the AdvBench goals with their templated refusals, experiments/smollm2_study.py `data`), each
# rendered as a chat (user turn, assistant turn) by the model's own template: 1,822 documents in a fixed
# shuffled order (so the cards' first 100k tokens hold both sources), about 313k tokens, all the instruction
# text the repository reaches offline. Held out: the study's 200 held-out Dolly records, for the evaluation.
# One mid layer (15 of 30, normalised depth 0.52), resid_post.
# Every step reads whole documents (1,024-token windows; the 23 longer records are cut to their first ~1,016
# tokens, 10% of the corpus' tokens): a window that
# starts mid-document makes SmolLM2 put an attention sink on its first token after the start token (residual norm
# about 11,000 against a median of 170), which would dominate the explained variance and top the feature cards.
set -euo pipefail
RUN=${RUN:-runs/lm_ship/smollm2}
OUT=${OUT:-saes/pretrained/smollm2}
THREADS=${THREADS:-2}
HOOK=blocks.15.hook_resid_post
MODEL=smollm2-135m-instruct
CONTEXT=1024
mkdir -p "$RUN"
python -m experiments.smollm2_study data
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
            if tokenizer.bos_token and text.startswith(tokenizer.bos_token):  # collect adds the start token
                text = text[len(tokenizer.bos_token):]
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= context:  # its beginning only (20 Dolly-train and 3 held-out records are longer)
                text = tokenizer.decode(ids[:context - 8])
            texts.append(text)
    longest = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    if longest >= context:
        sys.exit(f"a {name} document still has {longest} tokens: lower the cut")
    random.Random(0).shuffle(texts)
    with open(f"{run}/{name}.jsonl", "w") as out:
        out.writelines(json.dumps({"text": t}) + "\n" for t in texts)
PY
python -m interp collect --model "$MODEL" --hooks "$HOOK" --text "$RUN/corpus.jsonl" --context "$CONTEXT" \
    --threads "$THREADS" --out "$RUN/store"
python -m saes train --store "$RUN/store" --block "$HOOK" --out "$RUN/sae" --d-sae 4608 --k 32 \
    --tokens 3000000 --batch-size 4096 --lr 5e-4 --threads "$THREADS"
mkdir -p "$OUT/$HOOK"
cp "$RUN/sae/cfg.json" "$RUN/sae/sae_weights.safetensors" "$RUN/sae/train_summary.json" "$OUT/$HOOK/"
python -c "import sys; from saes.sae import SAE; SAE.load(sys.argv[1]).astype('float16').save(sys.argv[1])" \
    "$OUT/$HOOK"  # shipped in fp16; the evaluation and cards below measure the fp16 weights
python -m saes eval --sae "$OUT/$HOOK" --model "$MODEL" --text "$RUN/heldout.jsonl" --tokens 20000 \
    --context "$CONTEXT" --threads "$THREADS" --out "$OUT/$HOOK/eval.json" --overwrite
python -m saes features --sae "$OUT/$HOOK" --model "$MODEL" --text "$RUN/corpus.jsonl" --tokens 100000 \
    --threads "$THREADS" --out "$OUT/$HOOK" --overwrite
