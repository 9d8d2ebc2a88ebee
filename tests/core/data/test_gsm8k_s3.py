"""GSM8K loading from s3:// URLs against a real (moto) S3 server."""

from __future__ import annotations

import copy
import json

import pytest

from core.data import load_gsm8k

pytestmark = pytest.mark.integration

ROWS = [
    {"question": "Tom has 3 apples and buys 2 more. How many?", "answer": "3+2=<<3+2=5>>5\n#### 5"},
    {"question": "Mia has 10 pens and loses 4. How many?", "answer": "#### 6"},
]


def _check_rows(samples: list[dict]) -> None:
    assert [(s["id"], s["question"], s["answer"]) for s in samples] == [
        (f"gsm8k-train-{i}", r["question"], r["answer"]) for i, r in enumerate(ROWS)
    ]


def test_s3_file_and_prefix(s3_client, s3_bucket: str, s3_storage_options: dict) -> None:
    body = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    s3_client.put_object(Bucket=s3_bucket, Key="gsm8k/train.jsonl", Body=body)
    before = copy.deepcopy(s3_storage_options)

    url = f"s3://{s3_bucket}/gsm8k/train.jsonl"
    _check_rows(load_gsm8k(url, "train", storage_options=s3_storage_options))
    assert s3_storage_options == before  # datasets adds keys to the dict it gets
    _check_rows(load_gsm8k(f"s3://{s3_bucket}/gsm8k", "train", storage_options=s3_storage_options))
    assert s3_storage_options == before

    missing = f"s3://{s3_bucket}/gsm8k/test.jsonl"
    with pytest.raises(FileNotFoundError, match=missing):
        load_gsm8k(missing, "test", storage_options=s3_storage_options)
