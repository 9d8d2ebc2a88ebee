"""A small byte-level BPE tokenizer trained locally, saved in Hugging Face format.

Digits are split one per token (arithmetic is easier to learn when "128" is always the same three
symbols), and the byte-level alphabet means no text is ever out of vocabulary, so GSM8K or tool
output outside the training corpus still round-trips exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
# Agent tool tags (core.workflows.tools) as single, non-special tokens: decoding keeps them, and a
# closing tag can be a stop token so a model turn ends exactly at its tool call.
TOOL_TAG_TOKENS = ["<calc>", "</calc>", "<python>", "</python>", "<result>", "</result>"]


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus`` and wrap it for ``transformers``.

    The result is deterministic for a given corpus (BPE training has no randomness).
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(
            f"model.vocab_size={vocab_size} is too small: byte-level BPE needs at least "
            f"{256 + len(SPECIAL_TOKENS)} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)"
        )
    core = Tokenizer(models.BPE(unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",  # batched generation appends on the right
    )
    tokenizer.add_tokens(TOOL_TAG_TOKENS)
    logger.info("trained a byte-level BPE tokenizer with %d tokens", len(tokenizer))
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> None:
    """Save so that ``AutoTokenizer.from_pretrained(directory)`` loads it."""
    tokenizer.save_pretrained(str(directory))


def number_tokens(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids of the vocabulary's tokens that are digits only (``7``, `` 19``)."""
    vocab = tokenizer.get_vocab()
    return sorted(i for i in vocab.values() if tokenizer.decode([i]).strip().isdigit())
