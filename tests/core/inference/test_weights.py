"""A corrupt safetensors file inside an allowed weight root: refused with a 400, old weights kept.

Before: safetensors raises its own ``SafetensorError`` (not an ``OSError``/``ValueError``), which
reached the server's catch-all as a 500.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from core.inference.api import WeightSource
from core.inference.engine.weights import read_state_dict

pytestmark = pytest.mark.integration


def _corrupt_copies(model_dir: Path, root: Path) -> dict[str, Path]:
    """Folders like the model's, each with a broken ``model.safetensors``."""
    folders = {}
    for name in ("garbage", "truncated", "empty", "huge-header"):
        folder = root / name
        folder.mkdir()
        shutil.copy(model_dir / "config.json", folder / "config.json")
        folders[name] = folder
    (folders["garbage"] / "model.safetensors").write_bytes(b"this is not a safetensors file")
    whole = (model_dir / "model.safetensors").read_bytes()
    (folders["truncated"] / "model.safetensors").write_bytes(whole[: len(whole) // 2])
    (folders["empty"] / "model.safetensors").write_bytes(b"")
    header = (10**12).to_bytes(8, "little") + b"{}"
    (folders["huge-header"] / "model.safetensors").write_bytes(header)
    return folders


def test_a_corrupt_file_is_a_value_error_naming_it(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(64, 64)}, str(tmp_path / "model.safetensors"))
    whole = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(whole[:100])
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors"):
        read_state_dict(WeightSource(path=str(tmp_path)))


def test_corrupt_weights_are_a_400_and_the_old_weights_keep_serving(
    servers, model_dir, tmp_path
) -> None:
    handle = servers.start(model_dir=model_dir)
    body = {"input_ids": [5, 6, 7], "sampling_params": {"temperature": 0, "max_new_tokens": 6},
            "return_logprob": True}  # fmt: skip
    with httpx.Client(timeout=60) as http:
        before = http.post(handle.url + "/generate", json=body).json()
        for name, folder in _corrupt_copies(model_dir, tmp_path).items():
            assert folder.resolve().is_relative_to(model_dir.resolve().parent)  # allowed root
            response = http.post(
                handle.url + "/update_weights_from_disk", json={"model_path": str(folder)}
            )
            assert response.status_code == 400, (name, response.text)
            assert response.json()["success"] is False
            assert "not a readable safetensors file" in response.json()["message"], name
        assert handle.engine.version == 0 and not handle.engine.paused
        after = http.post(handle.url + "/generate", json=body).json()
    assert after["output_ids"] == before["output_ids"]
    assert (
        after["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]
    )
    assert after["meta_info"]["weight_version"] == "0"
