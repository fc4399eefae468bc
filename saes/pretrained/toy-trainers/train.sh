#!/usr/bin/env bash
# How the SAEs in this directory were made (issue 44's cross-trainer comparison); run from the repository root.
# Every trainer on the toy's six blocks with the same data and budget: one store of 1500 shapes-world images
# (world seed 0, the last denoising step), 2M training vectors, d_sae 256, batch 4096, lr 1e-3, seed 0, one thread.
# The k trainers (topk, batchtopk, matryoshka) have k 8; JumpReLU is pulled to L0 8 by sae-lens' quadratic L0 penalty
# (Gemma Scope 2's); the L1 trainers (standard, gated, p-anneal) have a fixed coefficient, so their L0 is what it
# gives (docs/image-saebench.md). Finished SAEs are skipped, unfinished ones resume from their checkpoints.
#   bash saes/pretrained/toy-trainers/train.sh                 # all of it (about an hour on one busy core)
#   TRAINERS="topk jumprelu" BLOCKS="up_blocks.1.attentions.2" bash saes/pretrained/toy-trainers/train.sh
set -uo pipefail
RUN=${RUN:-runs/toy_trainers}
STORE=${STORE:-$RUN/store}
OUT=${OUT:-saes/pretrained/toy-trainers}
TOKENS=${TOKENS:-2000000}
TRAINERS=${TRAINERS:-topk batchtopk matryoshka jumprelu standard gated p-anneal}
# the 16 x 16 blocks first (the ones the toy draws with), then the 8 x 8 ones
BLOCKS=${BLOCKS:-up_blocks.1.attentions.2 up_blocks.1.attentions.1 up_blocks.0.attentions.1 up_blocks.0.attentions.0 \
mid_block.attentions.0 down_blocks.2.attentions.1}
export OMP_NUM_THREADS=1
[ -f "$STORE/manifest.json" ] || python -m interp collect --model toy --world 1500 --world-seed 0 --steps 1 \
    --out "$STORE" || exit 1
options() {
    case $1 in
        matryoshka) echo "--option matryoshka_widths=[16,64,256]";;
        jumprelu) echo "--option jumprelu_sparsity_loss_mode=quadratic --option target_l0=8" \
                       "--option jumprelu_init_threshold=0.5 --option jumprelu_bandwidth=0.5";;
        standard) echo "--option l1_coefficient=5";;
        gated) echo "--option l1_coefficient=10";;
        p-anneal) echo "--option initial_sparsity_penalty=0.2";;
    esac
}
for block in $BLOCKS; do
    for arch in $TRAINERS; do
        dir=$RUN/$arch/$block
        if ! python -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))['tokens'] < int(sys.argv[2]))" \
                "$dir/train_summary.json" "$TOKENS" 2>/dev/null; then
            start=$(date +%s)
            # shellcheck disable=SC2046
            python -m saes train --store "$STORE" --block "$block" --out "$dir" --architecture "$arch" --d-sae 256 \
                --k 8 --tokens "$TOKENS" --batch-size 4096 --lr 1e-3 --dead-after-tokens 500000 --threads 1 \
                --log-every 50 $(options "$arch") > "$RUN/$arch-$block.log" 2>&1 \
                || { echo "$arch $block failed (see $RUN/$arch-$block.log)"; continue; }
            echo "$arch $block $(( $(date +%s) - start )) s"
        fi
        mkdir -p "$OUT/$arch/$block"
        cp "$dir/cfg.json" "$dir/sae_weights.safetensors" "$dir/train_summary.json" "$dir/train_log.jsonl" \
            "$OUT/$arch/$block/"
    done
done
echo done
