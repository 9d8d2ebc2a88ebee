"""Prompt templates that turn a question into text: a name below, or a format string.

``plain`` suits the tiny from-scratch models: they were trained on ``Question: ...\\nAnswer: ``
and continue after the trailing space. ``gsm8k_cot`` is the instruction used for GSM8K by
verl and AReaL with pretrained (chat) models; it asks for the final answer after ``####`` so
the same reward parser works for both.
"""

from __future__ import annotations

import string

TEMPLATES: dict[str, str] = {
    "plain": "Question: {question}\nAnswer: ",
    # verl's examples/data_preprocess/gsm8k.py: question + " " + instruction.
    "gsm8k_cot": "{question} "
    + 'Let\'s think step by step and output the final answer after "####".',
}


PLACEHOLDERS = ("question",)  # what a format-string template may name


def template_text(template: str) -> str:
    """The format string behind ``data.template``: a name in :data:`TEMPLATES`, or the string
    itself (``"Q: {question}\\nA: "``; :func:`template_problems` checks it)."""
    return TEMPLATES.get(template, template)


def render_prompt(question: str, template: str = "plain") -> str:
    """Render ``question`` with a named or format-string template."""
    # str.format only interprets braces in the template, so braces in questions are safe.
    return template_text(template).format(question=question)


def template_problems(template: str) -> list[str]:
    """Why ``data.template`` cannot render a question ([] = it can): an unknown name (no
    placeholder at all), an unknown placeholder, or broken braces."""
    text = template_text(template)
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as err:
        return [f"data.template={template!r} is not a valid format string: {err}"]
    unknown = [n for n in names if n not in PLACEHOLDERS]
    if unknown:
        return [
            f"data.template={template!r} names placeholder(s) {unknown}; available: "
            f"{['{' + p + '}' for p in PLACEHOLDERS]}"
        ]
    if "question" not in names:
        return [
            f"data.template={template!r} is neither a template name ({sorted(TEMPLATES)}) nor a "
            "format string with a {question} placeholder"
        ]
    return []
