"""The one path from a sample to model input and back: prompt ids, target ids, stop tokens.

SFT warm start, rollout, eval and the tool agent all build prompts here, so a model is trained
and scored on exactly the tokens it is sampled with.

``data.prompt_format``:

- ``template``: ``data.template`` — a name in :data:`core.data.templates.TEMPLATES` or a format
  string with a ``{question}`` placeholder (``"Q: {question}\\nA: "``) — tokenized with the
  tokenizer's own special tokens (a BOS for models that expect one, none for those that don't).
- ``chat``: the tokenizer's chat template (``apply_chat_template``) over an optional system
  message (``data.system_prompt``) and a user message holding the rendered ``data.template``,
  with the generation prompt added. The template writes its own special tokens.

Generation stops at EOS and, for ``chat``, at the template's end-of-turn token(s) — found by
rendering an assistant turn and reading which special tokens close it (``<|im_end|>`` for Qwen,
``<|eot_id|>`` for Llama 3; :func:`core.models.chat_template.end_of_turn_ids`). SFT targets end with the same token a sampled answer ends with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.data.templates import render_prompt, template_problems
from core.inference.stop_strings import stop_string_problems
from core.models.chat_template import end_of_turn_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase  # not at CLI start-up

PROMPT_FORMATS = ("template", "chat")


def sft_target(sample: dict[str, Any]) -> str:
    """The text SFT trains on: the sample's ``solution`` when it has one (code tasks, whose
    ``answer`` is the tests the reward runs), else its ``answer`` (a worked solution)."""
    solution = sample.get("solution")
    return solution if isinstance(solution, str) and solution else sample["answer"]


@dataclass
class Prompter:
    """Builds prompt and target token ids the same way for SFT, rollout and eval."""

    tokenizer: PreTrainedTokenizerBase
    prompt_format: str = "template"
    template: str = "plain"
    system_prompt: str = ""
    stop_strings: list[str] = field(default_factory=list)  # generation also ends after these
    stop_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"data.prompt_format={self.prompt_format!r} is not one of {list(PROMPT_FORMATS)}"
            )
        problems = template_problems(self.template)
        problems += stop_string_problems(self.stop_strings, "data.stop_strings")
        if problems:
            raise ValueError(problems[0])
        if self.prompt_format == "chat" and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "data.prompt_format=chat needs a tokenizer with a chat template "
                f"({self.tokenizer.name_or_path or 'this tokenizer'} has none); "
                "use data.prompt_format=template"
            )
        eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        turn_end = end_of_turn_ids(self.tokenizer) if self.prompt_format == "chat" else []
        self.stop_ids = list(dict.fromkeys([*turn_end, *eos]))

    @classmethod
    def from_config(cls, config: Any, tokenizer: PreTrainedTokenizerBase) -> Prompter:
        """From a :class:`core.config.Config` (its ``data`` section)."""
        data = config.data
        return cls(
            tokenizer,
            data.prompt_format,
            data.template,
            data.system_prompt,
            list(data.stop_strings),
        )

    def user_text(self, question: str) -> str:
        return render_prompt(question, self.template)

    def prompt_text(self, question: str, system: str | None = None) -> str:
        """The prompt as text, special tokens included (for chat). ``system`` (a sample's own
        system prompt) replaces ``data.system_prompt``."""
        if self.prompt_format == "template":
            return self.user_text(question)
        return self._render(self.opening(question, system), None, generation_prompt=True)

    def prompt_ids(self, question: str, system: str | None = None) -> list[int]:
        """Model input for ``question``, special tokens exactly as the tokenizer defines them."""
        text = self.prompt_text(question, system)
        if self.prompt_format == "template":
            return list(self.tokenizer(text)["input_ids"])
        # the chat template wrote the special tokens; tokenizing must not add more
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def opening(self, question: str, system: str | None = None) -> list[dict[str, Any]]:
        """The chat messages an episode starts from: the system prompt (``system``, else
        ``data.system_prompt``; none if both are empty) and the user's rendered question."""
        messages = [{"role": "user", "content": self.user_text(question)}]
        system = system or self.system_prompt
        return [{"role": "system", "content": system}, *messages] if system else messages

    def conversation_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int], list[int]]:
        """``(ids, loss_mask)`` of a whole conversation, for SFT on solved agent episodes: 1 on
        each assistant turn up to and including its end-of-turn token, 0 on everything else.

        Segments are tokenized one by one, as the agent client builds a trajectory at rollout
        time (context tokens appended after sampled ones), so SFT and RL see the same tokens.
        Needs a chat template whose output for a conversation is a prefix of its output for the
        conversation continued (ours and Qwen's are)."""
        if self.prompt_format != "chat":
            raise ValueError("SFT on conversations (sft_messages) needs data.prompt_format=chat")
        eot = self.tokenizer.decode(self.stop_ids[:1]) if self.stop_ids else ""
        ids: list[int] = []
        mask: list[int] = []
        done = ""  # the text already turned into ids

        def add(text: str, trained: int) -> None:
            piece = (
                list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
            )
            ids.extend(piece)
            mask.extend([trained] * len(piece))

        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self._render(messages[:k], tools, generation_prompt=True)
            after = self._render(messages[: k + 1], tools, generation_prompt=False)
            if not (before.startswith(done) and after.startswith(before)):
                raise ValueError(
                    "the chat template does not render a conversation as a prefix of its "
                    "continuation: SFT on sft_messages needs one that does"
                )
            add(before[len(done) :], 0)
            turn = after[len(before) :]
            cut = turn.find(eot) + len(eot) if eot and eot in turn else len(turn)
            add(turn[:cut], 1)  # the reply and its end-of-turn token
            done = before + turn[:cut]
        if not any(mask):
            raise ValueError("sft_messages has no assistant turn to train on")
        return ids, mask

    def _render(
        self, messages: list[dict[str, Any]], tools: Any, *, generation_prompt: bool
    ) -> str:
        return str(self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        ))  # fmt: skip

    def target_ids(self, answer: str) -> list[int]:
        """An SFT target: the answer, then the token a sampled answer stops at."""
        ids = list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])
        return ids + self.stop_ids[:1]
