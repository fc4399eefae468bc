#!/usr/bin/env bash
# How the SAEs in this directory were made (about 15 minutes on 2 CPU cores, and the causal label scores' 13); run from the repository root.
# Collect the analysed blocks of the embedded model (six for the toy: interp.models.t2i.TOY_BLOCKS) on 3000 shapes-world
# images, train one TopK SAE per block, analyse the features on 400 fresh images, and measure everything
# on 500 more (REPORT.md, report.json).
# MODEL=toy-v3 bash saes/pretrained/toy/ship.sh makes the same set for another embedded model (into saes/pretrained/toy-v3).
set -euo pipefail
MODEL=${MODEL:-toy}
RUN=${RUN:-runs/sae_ship$([ "$MODEL" = toy ] || echo "-$MODEL")}
STORE=${STORE:-$RUN/store}
OUT=${OUT:-saes/pretrained/$MODEL}
THREADS=${THREADS:-2}
# the model's analysed blocks (interp.models.t2i.KNOWN_MODELS): the toy's six, SDXL's four for toy-v3
read -ra BLOCKS <<< "$(python -c 'import sys; from interp.models.t2i import default_blocks; print(*default_blocks(sys.argv[1]))' "$MODEL")"
[ ${#BLOCKS[@]} -gt 0 ] || { echo "ship.sh: no analysed blocks for model $MODEL" >&2; exit 1; }
OMP_NUM_THREADS=$THREADS python -m interp collect --model "$MODEL" --world 3000 --world-seed 0 --steps 1 --out "$STORE" \
    --blocks "${BLOCKS[@]}"
for block in "${BLOCKS[@]}"; do
    python -m saes train --store "$STORE" --block "$block" --out "$RUN/$block" --d-sae 256 --k 8 \
        --tokens 10000000 --batch-size 4096 --lr 1e-3 --dead-after-tokens 500000 --threads "$THREADS" --log-every 50
    mkdir -p "$OUT/$block"
    cp "$RUN/$block/cfg.json" "$RUN/$block/sae_weights.safetensors" "$RUN/$block/train_summary.json" "$OUT/$block/"
    python -c "import sys; from saes.sae import SAE; SAE.load(sys.argv[1]).astype('float16').save(sys.argv[1])" \
        "$OUT/$block"  # shipped in fp16; the analysis and report below measure the fp16 weights
done
python -m saes features --model "$MODEL" --sae "${BLOCKS[@]/#/$OUT/}" --world 400 --world-seed 1 --threads "$THREADS" \
    --pool-dir "$OUT" --out "$RUN/features" --overwrite  # regenerates the shipped cards and pool on purpose
cp "$RUN/features/features_summary.json" "$OUT/"
# causal label scores (about 13 minutes on one busy thread): each labelled feature painted at 3 x its mean activation
# into 24 held-out objects per label, how often the probe then reads the label; the label search ranks by them
python -m saes causal --model "$MODEL" --sae "$OUT" --threads "$THREADS" --overwrite
python -m saes report --model "$MODEL" --root "$OUT" --features-summary "$OUT/features_summary.json" --store "$STORE" \
    --eval-images 500 --fidelity-images 32 --threads "$THREADS" $([ -f "$OUT/notes.md" ] && echo --notes-file "$OUT/notes.md") --overwrite
