"""Every architecture of the parity suite (and a Mamba) on both backends: what each backend does with it and by
how much TransformerLens' model differs from the Hugging Face model's own numbers at load.

For each row of `interp.hooks.lm_sites.VERIFIED_ARCHITECTURES` a tiny random model (`flowlens.tiny.tiny_family_lm`,
the suite's) is saved and loaded with ``--backend transformer_lens``; the load check
(`interp.models.lm.verify_transformer_lens`) compares it with `reference_run`, the Hugging Face model's numbers
taken before TransformerLens touched it. The table gives the largest relative difference it saw (logits and
residual hook points), the verdict (loaded, or the first words of the one-line refusal), the sites offered, and
for the Hugging Face backend the site-table family and whether greedy decoding needed the cached-decoding check.
Nothing here is timed.

    python -m benchmarks.lm_architectures --out experiments/results/lm_architectures.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch


def tiny_mamba(vocab: int):
    import transformers as T

    torch.manual_seed(0)
    return T.MambaForCausalLM(T.MambaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, state_size=4,
                                            pad_token_id=0, bos_token_id=2, eos_token_id=3)).eval()


def main(argv=None) -> int:
    import interp.models.lm as lm_module
    from flowlens.tiny import tiny_family_lm, word_level_tokenizer
    from interp.hooks.lm import model_sites
    from interp.hooks.lm_sites import VERIFIED_ARCHITECTURES, find_family
    from interp.models.generation import check_cached_decoding

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    words = "the cat sat on a mat and then it ran to see what the dog did with one red ball".split()
    tokenizer = word_level_tokenizer([" ".join(words)])
    seen: list[float] = []
    original = lm_module._relative_difference

    def spy(ours, theirs, mask):
        found = original(ours, theirs, mask)
        seen.append(found[0])
        return found

    lm_module._relative_difference = spy
    rows = []
    labels = [label for label, _, _ in VERIFIED_ARCHITECTURES] + ["mamba"]
    for label in labels:
        model = tiny_mamba(len(tokenizer)) if label == "mamba" else tiny_family_lm(label, len(tokenizer))
        family = find_family(model.config, type(model).__name__)
        row = {"architecture": label, "model_type": model.config.model_type, "class": type(model).__name__,
               "hf_site_family": family.name if family else None}
        try:
            check_cached_decoding(model, [tokenizer(" ".join(words[:7]))["input_ids"]], set(), 0)
            row["hf_cached_decoding"] = "equals the full forward"
        except ValueError as error:
            row["hf_cached_decoding"] = str(error)
        with tempfile.TemporaryDirectory() as directory:
            model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
            seen.clear()
            try:
                tl = lm_module.load_lm(directory, backend="transformer_lens")
                row["transformer_lens"] = f"loaded ({type(tl.model).__name__})"
                row["transformer_lens_sites"] = list(model_sites(tl))
                row["feature_cards_readout"] = tl.model.__dict__.get("_interp_readout") is True
            except lm_module.LMError as error:
                row["transformer_lens"] = "refused: " + str(error).replace(directory, "DIR")
        row["largest_relative_difference"] = max(seen) if seen else None
        rows.append(row)
        print(f"{label:22s} hf={row['hf_site_family'] or '-':9s} "
              f"tl={row['transformer_lens'][:60]:60s} diff={row['largest_relative_difference']}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
