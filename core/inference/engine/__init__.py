"""Our batched in-process engine: hf_engine.py (the InferenceEngine over a transformers model:
pause modes, weight updates, versions per token), batching.py (the decoding batch: one prefill
per group, continuations from the prefix cache), kv_batch.py (the growing KV cache),
prefix_cache.py, sampling.py (seeded, batch-independent), penalties.py, weights.py (weight
folders)."""
