"""One redaction for everything a run writes about itself (MLflow, Prefect, the run folder)."""

from __future__ import annotations

import pytest

from core.redaction import is_secret_key, redact, redact_value

pytestmark = pytest.mark.unit

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example: it holds '/'


@pytest.mark.parametrize(
    ("key", "secret"),
    [("aws_secret_access_key", True), ("api_key", True), ("HF_TOKEN", True), ("dbPassword", True),
     ("credentials", True), ("apiKey", True), ("ssh_key", True), ("X-Amz-Signature", True),
     ("sampling.max_new_tokens", False), ("model.tokenizer_path", False),
     ("checkpoint.keep_last", False), ("monkey", False), ("data.prompt_key", False)],
)  # fmt: skip
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        (f"postgresql://me:{SECRET}@db:5432/x", "postgresql://me:***@db:5432/x"),
        (f"s3://AKID:{SECRET}@bucket/x", "s3://AKID:***@bucket/x"),  # '/' in the password
        (f"https://h/x?a=1&token={SECRET}", "https://h/x?a=1&token=***"),
        (f"https://h/x?aws_secret_access_key={SECRET}&a=1", "https://h/x?aws_secret_access_key=***&a=1"),
        ("https://b.s3/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=dead",
         "https://b.s3/k?X-Amz-Credential=***&X-Amz-Signature=***"),
        (f"model.hf_token={SECRET}", "model.hf_token=***"),  # an override
        (f"Authorization: Bearer {SECRET}", "Authorization: ***"),
        ("id AKIAABCDEFGHIJKLMNOP", "id ***"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlMTIz", "jwt ***"),
        # a secret's name before it: YAML or a header, a flag, JSON inside a string
        ("password: hunter2", "password: ***"),
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: ***"),
        ("run --api-key sk-abc --steps 3", "run --api-key *** --steps 3"),
        ("serve --token=abc123", "serve --token=***"),
        ('{"api_key": "abc123", "prompt_key": "q"}', '{"api_key": "***", "prompt_key": "q"}'),
        # not secrets: left alone
        ("prompt_key: question, time: 12:30", "prompt_key: question, time: 12:30"),
        ("--max-new-tokens 8 --model-path /m", "--max-new-tokens 8 --model-path /m"),
        ("s3://bucket/path:with/colon@x", "s3://bucket/path:with/colon@x"),
        ("plain text, http://host:80/path", "plain text, http://host:80/path"),
        ("sampling.max_new_tokens=64", "sampling.max_new_tokens=64"),
        ("data.prompt_key=question", "data.prompt_key=question"),
    ],
)  # fmt: skip
def test_redact_value(raw: str, clean: str) -> None:
    assert redact_value(raw) == clean


def test_redact_nested_data() -> None:
    out = redact({"aws_secret_access_key": SECRET, "api_key": "", "n": 3,
                  "nested": {"password": SECRET, "url": f"redis://:{SECRET}@h"},
                  "layers": [("cli", {"tracking": {"mlflow_uri": f"http://u:{SECRET}@h"}})]})  # fmt: skip
    assert out == {"aws_secret_access_key": "***", "api_key": "", "n": 3,
                   "nested": {"password": "***", "url": "redis://:***@h"},
                   "layers": [["cli", {"tracking": {"mlflow_uri": "http://u:***@h"}}]]}  # fmt: skip
    assert SECRET not in repr(out)
