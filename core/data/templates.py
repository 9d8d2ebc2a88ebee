"""Prompt templates that turn a question into model input.

``plain`` suits the tiny from-scratch models: they were trained on ``Question: ...\\nAnswer: ``
and continue after the trailing space. ``gsm8k_cot`` is the instruction used for GSM8K by
verl and AReaL with pretrained (chat) models; it asks for the final answer after ``####`` so
the same reward parser works for both.
"""

from __future__ import annotations

TEMPLATES: dict[str, str] = {
    "plain": "Question: {question}\nAnswer: ",
    # verl's examples/data_preprocess/gsm8k.py: question + " " + instruction.
    "gsm8k_cot": "{question} "
    + 'Let\'s think step by step and output the final answer after "####".',
}


def _template(template: str) -> str:
    try:
        return TEMPLATES[template]
    except KeyError:
        raise ValueError(
            f"unknown prompt template {template!r}; valid names: {sorted(TEMPLATES)}"
        ) from None


def render_prompt(question: str, template: str = "plain") -> str:
    """Render ``question`` with the named template (see :data:`TEMPLATES`)."""
    # str.format only interprets braces in the template, so braces in questions are safe.
    return _template(template).format(question=question)


def chat_messages(question: str, template: str = "gsm8k_cot") -> list[dict[str, str]]:
    """One user message holding the rendered instruction, for chat-template models."""
    return [{"role": "user", "content": render_prompt(question, template)}]
