"""Bench eval types: every module here registers one or more with saes.bench.registry.register_eval at import."""
