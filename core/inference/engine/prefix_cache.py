"""Finished requests' KV caches, kept so a request that continues one prefills only what is new.

An agent's conversation is a chain of requests: each call's prompt is the previous prompt, the
reply the model sampled, then the tool results and the next generation prompt. Without this
cache every call prefills the whole conversation again (quadratic in the number of turns; on
CPU the search agent spent most of its engine time there). With it, a finished request leaves
its keys and values behind, and a later request whose tokens start with them computes only its
suffix -- what SGLang's radix cache and vLLM's automatic prefix caching do on a GPU server.

Entries hold the tokens the model has *read* (``prompt + output[:-1]``: the last sampled token
was never fed back) and one ``(keys, values)`` pair per layer, ``[heads, tokens, head_dim]``.
A hit takes the entry out (a conversation moves on, and its next reply leaves a longer one);
the least recently stored entries go first when the token budget is full. The engine clears
the cache when it loads new weights: a cached key computed with old weights would make the
"behaviour policy" of the next tokens a mix of two versions. Unless told to keep it
(``inference.kv_after_update=keep``, PipelineRL's in-flight weight update): then that mix is the
behaviour policy, and the log-probs the engine records are still exactly the ones it sampled with.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [H, L, D]


@dataclass
class Prefix:
    """A cached token sequence and its per-layer keys and values."""

    tokens: tuple[int, ...]
    layers: KeyValues

    def __len__(self) -> int:
        return len(self.tokens)


class PrefixCache:
    """At most ``max_tokens`` cached tokens in all, least recently stored evicted first."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix cache size must be >= 0 tokens, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self._lengths: dict[int, int] = {}  # length -> how many entries have it
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, tokens: list[int], layers: KeyValues) -> None:
        """Keep ``layers`` for ``tokens`` (replacing an entry for the same tokens)."""
        key = tuple(tokens)
        if not key or len(key) > self.max_tokens:
            return
        self._drop(key)
        self._entries[key] = Prefix(key, layers)
        self._lengths[len(key)] = self._lengths.get(len(key), 0) + 1
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def take(self, tokens: list[int]) -> Prefix | None:
        """Remove and return the longest entry that is a proper prefix of ``tokens`` (at least
        one token must be left to compute), or None."""
        for length in sorted(self._lengths, reverse=True):
            if length >= len(tokens):
                continue
            key = tuple(tokens[:length])
            if key in self._entries:
                prefix = self._entries[key]
                self._drop(key)
                return prefix
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        if self._entries.pop(key, None) is None:
            return
        self.tokens -= len(key)
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]
