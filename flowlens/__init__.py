"""FlowLens: residual-stream geometry, lexical diversity, refusal evaluation and VCL fine-tuning.

Submodules: ``diversity`` (n-gram entropies, distinct-n, MSTTR), ``geometry`` (PCA of residuals,
TwoNN, alignment, concentration), ``refusals`` (detector, metrics, evaluator), ``vcl`` (the
Variance Concentration Loss), ``finetune`` (SFT with optional VCL). ``python -m flowlens --help``.
"""
