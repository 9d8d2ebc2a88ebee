"""Engines in other processes, behind the same InferenceEngine contract: sglang_client.py
(SGLang's native HTTP API: real SGLang or ours), vllm_client.py (vLLM's OpenAI-style server),
http_client.py (the shared HTTP session, retries, auth), sglang_launcher.py (starting a server
process and waiting for it)."""
