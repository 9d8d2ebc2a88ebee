r"""The chat format of the models we build from scratch: Qwen-style turns, tools, tool calls.

:data:`TOOL_CHAT_TEMPLATE` is a Qwen2.5-style template (real chat models bring their own): turns
as ``<|im_start|>role\n...<|im_end|>\n``, a default system turn, tools listed in the system turn
inside ``<tools></tools>``, assistant calls as ``<tool_call>{json}</tool_call>``, tool results in
a user turn inside ``<tool_response></tool_response>``. Its output for a conversation is a prefix
of its output for the same conversation continued, which the agent client's one-trajectory mode
relies on. transformers renders templates with ``trim_blocks`` (a newline right after a block
tag is dropped), so newlines that follow a tag are written as ``{{ '\n' }}``.
"""

from __future__ import annotations

import functools

from transformers import PreTrainedTokenizerBase

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Single tokens, not special ones: decoding a reply keeps them, so its tool calls can be parsed.
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

TOOL_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set rest = messages[1:] %}"
    "{% else %}{% set system = 'You are a helpful assistant.' %}{% set rest = messages %}"
    "{% endif %}"
    "<|im_start|>system\n{{ system }}"
    "{% if tools %}{{ '\\n' }}<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}"
    "{% endfor %}{{ '\\n' }}</tools>"
    "{% endif %}<|im_end|>\n"
    "{% for message in rest %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or loop.previtem['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message['content'] }}\n</tool_response>"
    "{% if loop.last or loop.nextitem['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{{ '\\n' }}"
    '<tool_call>\n{"name": "{{ call["function"]["name"] }}", "arguments": '
    '{{ call["function"]["arguments"] | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def add_chat_format(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give ``tokenizer`` the turn tokens (special), the tool tags and the template, in place.
    The model's embeddings must then cover ``len(tokenizer)``."""
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.add_tokens(TOOL_TAGS)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


_PROBE = "\x1fasyncrl-probe\x1f"  # an assistant reply no template contains


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The special tokens the chat template closes an assistant turn with (worked out once per
    tokenizer and template: the chat endpoint and every agent episode ask for them)."""
    template = getattr(tokenizer, "chat_template", None)
    return list(_end_of_turn_ids(tokenizer, str(template), len(tokenizer)))


@functools.lru_cache(maxsize=16)
def _end_of_turn_ids(tokenizer: PreTrainedTokenizerBase, template: str, size: int) -> tuple:
    """``template`` and ``size`` are keys only: a tokenizer changed in place is worked out anew."""
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    tail = str(text).split(_PROBE, 1)[-1]
    special = set(tokenizer.all_special_ids) | {
        i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special
    }
    return tuple(i for i in tokenizer(tail, add_special_tokens=False)["input_ids"] if i in special)
