"""Data: GSM8K loading, synthetic GSM8K-style problems, prompting, resumable loader.

A sample is a plain dict ``{"id": str, "question": str, "answer": str}`` (a GSM8K-format
solution ending with ``#### N``), plus optional extra keys such as ``"style"``.
"""

from core.data.dataloader import ResumableDataLoader
from core.data.gsm8k import load_gsm8k, validate_rows
from core.data.prompting import Prompter
from core.data.synthetic import SyntheticSpec, generate_problems, generate_splits
from core.data.templates import TEMPLATES, render_prompt

__all__ = [
    "TEMPLATES",
    "Prompter",
    "ResumableDataLoader",
    "SyntheticSpec",
    "generate_problems",
    "generate_splits",
    "load_gsm8k",
    "render_prompt",
    "validate_rows",
]
