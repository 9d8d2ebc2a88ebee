"""Secrets never written: one redaction for everything a run records about itself.

MLflow params, tags and artifacts, the Prefect flow-run parameters, and the run folder's
``config.yaml`` / ``summary.json`` all pass through :func:`redact`. A value is masked when its key
names a credential (``aws_secret_access_key``, ``apiKey``, ``hf_token``: whole words, so
``max_new_tokens`` passes), and inside any string: URL passwords (``s3://user:***@host``, also
when the password holds ``/`` as AWS secrets do), ``…key=…``/``…token=…`` query parameters,
a secret's value after its name in JSON (``"api_key": "…"``), YAML (``password: …``) or a
command-line flag (``--api-key …``), and well-known credential shapes (AWS key ids, GitHub/Hugging Face/OpenAI/Slack tokens, bearer
tokens, JWTs). Pass secrets through the environment (``key=${oc.env:NAME}`` in a config or an
override is resolved at run time and stored as written).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# Whole words of a key (split on non-alphanumerics and camelCase).
_SECRET_WORDS = {
    "secret", "secrets", "password", "passwords", "passwd", "pwd", "passphrase", "token",
    "apikey", "credential", "credentials", "auth", "authorization", "cookie", "signature", "sig",
}  # fmt: skip
# "key" is a secret only after one of these (api_key, access_key, private_key; not prompt_key).
_KEY_KINDS = {"api", "access", "secret", "private", "ssh", "signing", "encryption", "master",
              "account", "client", "session", "license"}  # fmt: skip
# scheme://user:password@ — the password runs to the last '@' before whitespace.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*):(?P<pw>[^\s@]+)@")
# name=value (a query parameter, an override, an env assignment): masked when the name is a
# secret key — token=, api_key=, aws_secret_access_key=, X-Amz-Signature= (presigned), sig= (SAS).
_ASSIGNMENT = re.compile(r"(?<![\w.\-])(?P<name>[A-Za-z_][\w.\-]*)=(?P<value>[^&\s]+)")
# Other shapes a secret's name precedes it in: JSON ("api_key": "abc123"), YAML or a header
# (password: hunter2), a command-line flag (--api-key sk-..., --token=...).
_JSON_PAIR = re.compile(r'"(?P<name>[^"\\]{1,100})"\s*:\s*"(?P<value>(?:[^"\\]|\\.)+)"')
_COLON_PAIR = re.compile(
    r"(?<![\w.\-/])(?P<name>[A-Za-z_][\w.\-]*)\s*:[ \t]*(?P<value>(?i:(?:basic|bearer|digest|token)[ \t]+)?[^\s,;&\"'}]+)"
)
_FLAG = re.compile(r"(?<!\S)--?(?P<name>[A-Za-z][\w\-]*)(?:[ \t]+|=)(?P<value>[^\s\-][^\s]*)")
# Well-known credential shapes that may appear bare in a value.
_CREDENTIAL_VALUE = re.compile(
    r"\b(?:(?:AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|xox[abpr]-[A-Za-z0-9\-]{10,}"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})\b"
    r"|(?i:bearer\s+)[A-Za-z0-9._\-~+/]{8,}=*"
)


def is_secret_key(key: str) -> bool:
    """True when a word of ``key`` names a credential (``aws_secret_access_key``, ``apiKey``)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)
    words = [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]
    if any(word in _SECRET_WORDS for word in words):
        return True
    return any(
        w in ("key", "keys") and prev in _KEY_KINDS
        for prev, w in zip(words, words[1:], strict=False)
    )


def redact_value(value: str) -> str:
    """Mask passwords in URLs (``s3://u:***@host``), ``token=...`` queries and bare credentials."""
    value = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", value)
    value = _ASSIGNMENT.sub(
        lambda m: f"{m['name']}={REDACTED}" if is_secret_key(m["name"]) else m[0], value
    )
    for shape in (_JSON_PAIR, _COLON_PAIR, _FLAG):
        value = shape.sub(_masked, value)
    return _CREDENTIAL_VALUE.sub(REDACTED, value)


def _masked(match: re.Match[str]) -> str:
    """The match with its ``value`` group masked when its ``name`` is a secret key."""
    if not is_secret_key(match["name"]) or match["value"] == REDACTED:
        return match[0]
    start, end = match.span("value")
    offset = match.start()
    return f"{match[0][: start - offset]}{REDACTED}{match[0][end - offset :]}"


def redact(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a (nested) mapping with secret keys' values masked and string values cleaned.

    Secret keys are kept with a masked value (so one can see that it was set, never what it is);
    empty values stay empty. ``key=value`` strings (overrides) are judged by their key.
    """

    def clean(key: str, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(str(k), v) for k, v in value.items()}
        if is_secret_key(key) and value not in (None, "", [], {}):
            return REDACTED
        if isinstance(value, str):
            return redact_value(value)
        if isinstance(value, list | tuple):
            return [clean(key, v) for v in value]
        return value

    return {str(k): clean(str(k), v) for k, v in data.items()}


def secret_overrides(overrides: list[str]) -> list[str]:
    """The ``key=value`` overrides that hold a secret, shown redacted (for an error or warning)."""
    return [redact_value(o) for o in overrides if redact_value(o) != o]
