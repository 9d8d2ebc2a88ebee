"""SGLang's ``/generate`` body as SGLang clients send it, checked and turned into our requests.

The schema is SGLang's (0.5.23 and its main branch): ``GenerateReqInput``
(``sglang/srt/managers/io_struct.py``) for the body and ``SamplingParams``
(``sglang/srt/sampling/sampling_params.py``) for ``sampling_params``, with
SGLang's defaults, ranges and ``None``-means-default rule. Every field of both is one of:

- *honoured*: :data:`SAMPLING_HONOURED` and :data:`GENERATE_HONOURED` (the table in
  docs/concepts/server.md says what each does here);
- *inert*: accepted whatever its value, because it changes nothing about the tokens (metrics
  and tracing labels, and ``model``, which SGLang's router adds to every body it forwards);
- *default only*: a feature this engine does not have (grammars, multimodal inputs, LoRA, top
  logprobs, hidden states, disaggregation, ...): accepted at its default (absent, null, false,
  0, empty; a list of them for a batch), else a 400 naming it.

Anything else is a 400 naming it. SGLang ignores unknown body keys (pydantic's default) and
refuses unknown sampling keys; we refuse both, so a misspelt field never passes silently.

``n`` (parallel samples of each prompt) is expanded as SGLang's ``_handle_parallel_sampling``
does: a single prompt with ``n > 1`` becomes a batch, and the answers come prompt by prompt,
``n`` for each (``rid`` ``r`` becomes ``r_0 ... r_{n-1}``). The samples share every sampling
parameter, the seed included: seeded samples are identical, as in SGLang (send a batch with one
seed each instead). ``rid`` is a string of at most ``max_rid_chars`` or null (for a batch also a
list, or one string numbered per prompt); ``return_logprob`` and ``stream`` are booleans
(``stream`` false). Rules shared with the other endpoints are in :mod:`core.inference.server.validation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.inference.api import SamplingParams
from core.inference.engine.sampling import is_int
from core.inference.server.validation import (
    RequestError,
    RequestLimits,
    _finite,
    _int_in,
    _kind,
    _no_unknown,
    _object,
    _optional_bool,
    token_ids,
)
from core.inference.stop_strings import stop_string_problems

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when a request does not say
MIN_TEMPERATURE = 1e-6  # below this (and above 0) the scaled logits overflow float32
MAX_TEMPERATURE = 1e4

SAMPLING_HONOURED = frozenset(
    {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
     "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "stop", "stop_token_ids",
     "sampling_seed", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
     "no_stop_trim", "logit_bias"}
)  # fmt: skip
SAMPLING_INERT = frozenset({"custom_params", "stream_interval"})  # no processor, no streaming
# Stop regexes would run Python's backtracking matcher after every token inside the batch loop:
# one pathological pattern would stall every request of the batch, so they stay unsupported.
SAMPLING_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "stop_regex": ("", []), "json_schema": (), "regex": (), "ebnf": (), "structural_tag": (),
    "ebnf_full_assistant": (False,), "beam_width": (1,), "watermark": (),
}  # fmt: skip
GENERATE_HONOURED = frozenset(
    {"input_ids", "sampling_params", "return_logprob", "rid", "stream", "priority", "session_id",
     "return_text_in_logprobs", "text"}
)  # fmt: skip
GENERATE_INERT = frozenset(
    {"model", "log_metrics", "no_logs", "custom_labels", "external_trace_header",
     "received_time", "conversation_id", "routing_key"}
)  # fmt: skip
GENERATE_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    **dict.fromkeys(
        ["input_embeds", "image_data", "video_data", "audio_data", "mm_hashes",
         "mm_content_hashes", "video_config", "modalities", "session_params", "lora_path",
         "lora_id", "custom_logit_processor", "positional_embed_overrides", "bootstrap_host",
         "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size",
         "disagg_prefill_dp_rank", "kv_router_hint", "http_worker_ipc", "max_thinking_tokens",
         "num_items_assigned", "encoder_urls", "max_dynamic_patch", "min_dynamic_patch",
         "image_max_dynamic_patch", "video_max_dynamic_patch", "images_config",
         "multi_item_delimiter_indices", "watermark", "mm_processor_kwargs",
         "token_indices_to_pool", "kv_hints"],
        (),
    ),
    **dict.fromkeys(
        ["use_audio_in_video", "return_sampling_mask", "return_flat_raw_top_logprobs",
         "return_flat_raw_top_logprobs_b64", "return_hidden_states", "return_routed_experts",
         "return_indexer_topk", "background", "require_reasoning", "return_bytes",
         "return_entropy", "return_prompt_token_ids", "need_wait_for_mm_inputs",
         "return_flat_raw_output_top_logprobs"],
        (False,),
    ),
    "logprob_start_len": (-1,),  # -1: logprobs of the output only, which is what we return
    "top_logprobs_num": (0,),
    "sampling_logprobs_mode": ("selected",),  # the chosen token's logprob: what we return
    "token_ids_logprob": ([],),
    "routed_experts_start_len": (0,),
    "routed_dp_rank": (0,),  # one data-parallel rank here
    "data_parallel_rank": (0,),
    "extra_key": ("",),
    "cache_salt": ("",),
}  # fmt: skip
SAMPLING_FIELDS = SAMPLING_HONOURED | SAMPLING_INERT | frozenset(SAMPLING_DEFAULT_ONLY)
GENERATE_FIELDS = GENERATE_HONOURED | GENERATE_INERT | frozenset(GENERATE_DEFAULT_ONLY)


@dataclass(frozen=True)
class TextOptions:
    """How the output text is decoded (SGLang's detokenizer flags; text needs a tokenizer)."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True


@dataclass
class GenerateBatch:
    """A validated ``/generate`` body: one entry per sample (prompt x ``n``)."""

    prompts: list[list[int]]
    samplings: list[SamplingParams]
    rids: list[str | None]
    return_logprob: bool
    batched: bool  # answer with a list (input_ids was a list of prompts, or n > 1)
    priorities: list[int]  # SGLang's "priority" per prompt (0 when not given)
    texts: list[TextOptions]
    sessions: list[str]  # SGLang's session_id ("" = none)
    return_text_in_logprobs: bool = False


# ---------------------------------------------------------------------- defaults-only fields


def is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    """Absent/null, one of ``defaults`` (of the same JSON type), or a non-empty list of such
    (a batch's per-prompt form)."""
    if value is None or any(type(value) is type(d) and value == d for d in defaults):
        return True
    return isinstance(value, list) and bool(value) and all(is_default(v, defaults) for v in value)


def _defaults_only(raw: dict[str, Any], table: dict[str, tuple[Any, ...]], prefix: str) -> None:
    for name, defaults in table.items():
        if name in raw and not is_default(raw[name], defaults):
            shown = ", ".join(["null", *map(repr, defaults)])
            raise RequestError(
                f"{prefix}{name}",
                f"is not supported by this server; only its default is accepted ({shown})",
            )


# ---------------------------------------------------------------------- sampling_params


def _bounded(raw: dict[str, Any], name: str, field: str, default: float, low: float, high: float,
             open_low: bool = False) -> float:  # fmt: skip
    value = raw.get(name)
    number = default if value is None else _finite(value, f"{field}.{name}")
    if not low <= number <= high or (open_low and number == low):
        left = "(" if open_low else "["
        raise RequestError(f"{field}.{name}", f"{number} must be in {left}{low}, {high}]")
    return number


def _flag(raw: dict[str, Any], name: str, field: str, default: bool) -> bool:
    return _optional_bool(raw.get(name), f"{field}.{name}", default)


def _logit_bias(value: Any, field: str, vocab_size: int) -> dict[int, float]:
    """SGLang's ``{"token id": bias}`` (JSON keys are strings) -> ``{id: bias}``."""
    if value is None:
        return {}
    bias = {}
    for key, number in _object(value, field).items():
        if not (isinstance(key, str) and key.isdecimal() and str(int(key)) == key):
            raise RequestError(field, f"keys are token ids as decimal strings, got {key[:20]!r}")
        token = _int_in(int(key), f"{field}[{key}]", 0, vocab_size - 1)
        bias[token] = _finite(number, f"{field}[{key}]")
    return bias


def _stop_strings(raw: dict[str, Any], limits: RequestLimits, field: str) -> list[str]:
    stop = raw.get("stop")
    stop = [] if stop in (None, "", []) else [stop] if isinstance(stop, str) else stop
    if stop and not limits.stop_strings:
        raise RequestError(f"{field}.stop", "stop strings need a tokenizer; use stop_token_ids")
    if not isinstance(stop, list):
        raise RequestError(
            f"{field}.stop", f"must be a string or a list of strings, got {_kind(stop)}"
        )
    if problems := stop_string_problems(stop, f"{field}.stop"):
        raise RequestError(f"{field}.stop", problems[0].split(": ", 1)[-1])
    return stop


def _max_new_tokens(raw: dict[str, Any], n_prompt: int, limits: RequestLimits, field: str) -> int:
    room = limits.room(n_prompt)
    if raw.get("max_new_tokens") is None:  # SGLang's default, lowered to the cap
        return DEFAULT_MAX_NEW_TOKENS if room is None else min(DEFAULT_MAX_NEW_TOKENS, room)
    return _int_in(raw["max_new_tokens"], f"{field}.max_new_tokens", 0, room)


def _temperature(raw: dict[str, Any], field: str) -> float:
    value = raw.get("temperature")
    temperature = 1.0 if value is None else _finite(value, f"{field}.temperature")
    if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        raise RequestError(
            f"{field}.temperature",
            f"{temperature} must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]",
        )
    return temperature


def _seed(raw: dict[str, Any], field: str) -> int | None:
    seed = raw.get("sampling_seed")
    if seed is not None and not is_int(seed):
        # No coercion: "7" or 7.5 would silently become another seed than the caller meant.
        raise RequestError(f"{field}.sampling_seed", f"must be an integer, got {_kind(seed)}")
    return seed


def parse_sampling(raw: Any, n_prompt: int, limits: RequestLimits, field: str) -> SamplingParams:
    """SGLang ``sampling_params`` -> ours (SGLang's ``top_k=-1`` means off, as our 0 does).

    Ranges are SGLang's (``SamplingParams.verify``): ``min_p`` in [0, 1], frequency and presence
    penalties in [-2, 2], ``repetition_penalty`` in (0, 2], ``min_new_tokens`` in
    [0, max_new_tokens]. ``n`` and the text flags are read by :func:`sampling_extras`.
    """
    raw = {} if raw is None else _object(raw, field)
    _no_unknown(raw, SAMPLING_FIELDS, field)
    _defaults_only(raw, SAMPLING_DEFAULT_ONLY, f"{field}.")
    for name in ("no_stop_trim", "ignore_eos", "skip_special_tokens",
                 "spaces_between_special_tokens"):  # fmt: skip
        _flag(raw, name, field, False)
    stop = _stop_strings(raw, limits, field)
    max_new = _max_new_tokens(raw, n_prompt, limits, field)
    top_p = _bounded(raw, "top_p", field, 1.0, 0.0, 1.0, open_low=True)
    top_k = raw.get("top_k")
    top_k = -1 if top_k is None else _int_in(top_k, f"{field}.top_k", -1, None)
    stop_ids = raw.get("stop_token_ids") or []
    stop_ids = token_ids(stop_ids, f"{field}.stop_token_ids", limits.vocab_size, allow_empty=True)
    if len(stop_ids) > limits.max_stop_ids:
        raise RequestError(f"{field}.stop_token_ids", f"at most {limits.max_stop_ids} ids")
    min_new = raw.get("min_new_tokens")
    min_new = 0 if min_new is None else _int_in(min_new, f"{field}.min_new_tokens", 0, max_new)
    if raw.get("n") is not None:
        _int_in(raw["n"], f"{field}.n", 1, limits.max_prompts)
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=_temperature(raw, field),
        top_p=top_p,
        top_k=max(top_k, 0),
        stop_token_ids=list(stop_ids),
        stop=list(stop),
        seed=_seed(raw, field),
        min_p=_bounded(raw, "min_p", field, 0.0, 0.0, 1.0),
        frequency_penalty=_bounded(raw, "frequency_penalty", field, 0.0, -2.0, 2.0),
        presence_penalty=_bounded(raw, "presence_penalty", field, 0.0, -2.0, 2.0),
        repetition_penalty=_bounded(raw, "repetition_penalty", field, 1.0, 0.0, 2.0, open_low=True),
        min_new_tokens=min_new,
        ignore_eos=_flag(raw, "ignore_eos", field, False),
        logit_bias=_logit_bias(raw.get("logit_bias"), f"{field}.logit_bias", limits.vocab_size),
    )


def sampling_extras(raw: Any) -> tuple[int, TextOptions]:
    """``n`` and the text flags of a ``sampling_params`` that :func:`parse_sampling` accepted."""
    raw = raw or {}
    text = TextOptions(
        skip_special_tokens=_flag(raw, "skip_special_tokens", "", True),
        spaces_between_special_tokens=_flag(raw, "spaces_between_special_tokens", "", True),
    )
    return raw.get("n") or 1, text


# ---------------------------------------------------------------------- the body


def _prompts(value: Any, limits: RequestLimits) -> tuple[list[list[int]], bool]:
    """``input_ids`` -> (prompts, batched)."""
    if value is None:
        raise RequestError(
            "input_ids", "required: this server has no tokenizer (skip_tokenizer_init)"
        )
    if not isinstance(value, list):
        raise RequestError("input_ids", f"must be a list of token ids, got {_kind(value)}")
    if not value:
        raise RequestError("input_ids", "must not be empty")
    if not any(isinstance(v, list) for v in value):
        return [_prompt(value, "input_ids", limits)], False
    if len(value) > limits.max_prompts:
        raise RequestError("input_ids", f"{len(value)} prompts: at most {limits.max_prompts}")
    return [_prompt(p, f"input_ids[{i}]", limits) for i, p in enumerate(value)], True


def _prompt(value: Any, field: str, limits: RequestLimits) -> list[int]:
    ids = token_ids(value, field, limits.vocab_size)
    if limits.context_length is not None and len(ids) >= limits.context_length:
        raise RequestError(field, f"{len(ids)} tokens: the context holds {limits.context_length}")
    return ids


def _per_prompt(value: Any, n: int, batched: bool, field: str) -> list[Any]:
    """A field given once for all prompts, or (batch only) as a list of one per prompt."""
    if batched and isinstance(value, list):
        if len(value) != n:
            raise RequestError(field, f"has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def _rids(value: Any, n: int, batched: bool, limits: RequestLimits) -> list[str | None]:
    rids = _per_prompt(value, n, batched, "rid")
    for rid in rids:
        if rid is not None and not isinstance(rid, str):
            raise RequestError("rid", f"must be a string or null, got {_kind(rid)}")
        if rid is not None and len(rid) > limits.max_rid_chars:
            raise RequestError("rid", f"at most {limits.max_rid_chars} characters")
    if batched and isinstance(value, str):  # one rid for the batch: number its prompts
        return [f"{value}_{i}" for i in range(n)]
    return rids


def _priorities(value: Any, n: int, batched: bool) -> list[int]:
    if value is None:
        return [0] * n
    priorities = _per_prompt(value, n, batched, "priority")
    for p in priorities:
        if isinstance(p, bool) or not isinstance(p, int) or abs(p) >= 2**63:
            raise RequestError("priority", f"must be a 64-bit integer, got {_kind(p)}")
    return priorities


def _sessions(value: Any, n: int, batched: bool) -> list[str]:
    sessions = _per_prompt(value, n, batched, "session_id")
    for s in sessions:
        if s is not None and not (isinstance(s, str) and len(s) <= 256):
            raise RequestError("session_id", "must be a string of at most 256 characters")
    return [s or "" for s in sessions]


def _parallel_samples(raw_sampling: list[Any]) -> int:
    """SGLang's ``parallel_sample_num``: the same ``n`` in every prompt's sampling_params."""
    counts = {sampling_extras(s)[0] for s in raw_sampling}
    if len(counts) > 1:
        raise RequestError("sampling_params.n", "must be the same for every prompt")
    return counts.pop()


def _repeat(values: list[Any], n: int) -> list[Any]:
    return [v for v in values for _ in range(n)]


def parse_generate(body: Any, limits: RequestLimits) -> GenerateBatch:
    """A ``/generate`` body -> validated samples: each prompt ``n`` times, prompt by prompt."""
    body = _object(body, "body")
    if "text" in body:
        raise RequestError(
            "text", "this server has no tokenizer (skip_tokenizer_init): send input_ids"
        )
    _no_unknown(body, GENERATE_FIELDS, "")
    _defaults_only(body, GENERATE_DEFAULT_ONLY, "")
    if _optional_bool(body.get("stream"), "stream", False):
        raise RequestError("stream", "streaming is not supported")
    in_text = _optional_bool(body.get("return_text_in_logprobs"), "return_text_in_logprobs", False)
    if in_text and not limits.stop_strings:
        raise RequestError("return_text_in_logprobs", "needs a tokenizer in the model folder")
    prompts, batched = _prompts(body.get("input_ids"), limits)
    count = len(prompts)
    raw_sampling = _per_prompt(body.get("sampling_params"), count, batched, "sampling_params")
    samplings = [
        parse_sampling(s, len(p), limits, f"sampling_params[{i}]" if batched else "sampling_params")
        for i, (s, p) in enumerate(zip(raw_sampling, prompts, strict=True))
    ]
    n = _parallel_samples(raw_sampling)
    if count * n > limits.max_prompts:
        raise RequestError(
            "sampling_params.n", f"{count} x {n} samples: at most {limits.max_prompts}"
        )
    rids = _rids(body.get("rid"), count, batched, limits)
    if n > 1:
        rids = [None if r is None else f"{r}_{j}" for r in rids for j in range(n)]
    return GenerateBatch(
        prompts=_repeat(prompts, n),
        samplings=_repeat(samplings, n),
        rids=rids,
        return_logprob=_optional_bool(body.get("return_logprob"), "return_logprob", False),
        batched=batched or n > 1,
        priorities=_repeat(_priorities(body.get("priority"), count, batched), n),
        texts=_repeat([sampling_extras(s)[1] for s in raw_sampling], n),
        sessions=_repeat(_sessions(body.get("session_id"), count, batched), n),
        return_text_in_logprobs=in_text,
    )
