"""A tiny model whose tokenizer carries a Qwen-style chat template, built locally (no hub).

``<|im_start|>``/``<|im_end|>`` are added as special tokens and the embeddings resized, as a
chat model's tokenizer and model would have them.
"""

from __future__ import annotations

from pathlib import Path

from core.models import create_pretrained, load_model, load_tokenizer

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Qwen's layout: a default system turn when none is given, each turn closed by <|im_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_chat_model(directory: Path, corpus: list[str], seed: int = 1) -> Path:
    """The tiny preset trained on ``corpus``, with a chat-template tokenizer, saved to ``directory``."""
    create_pretrained("tiny", corpus, directory, vocab_size=400, seed=seed)
    tokenizer = load_tokenizer(directory)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.chat_template = CHAT_TEMPLATE
    model = load_model(directory)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory
