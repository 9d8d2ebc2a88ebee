"""Learner state on disk: sharded checkpoints (DCP) and Hugging Face exports.

Checkpoints
    ``save_state``/``load_state`` write model, optimizer, LR scheduler and counters through
    ``torch.distributed.checkpoint`` with ``checkpoint_id=url``: DCP picks the local file writer
    for a path and the fsspec writer for any other URL (``s3://bucket/run/step_10``). Never build
    a ``FileSystemWriter`` from a URL yourself: it silently writes to a local folder named
    ``s3:``. Each rank writes its own shards; DCP writes ``.metadata`` last, so
    ``checkpoint_complete(url)`` doubles as the commit marker. DCP reshards on load, so a
    checkpoint from R ranks loads on any other number of ranks (or one plain process).
    With ``trainable_only`` (LoRA) the model part holds the trainable parameters alone; the
    frozen ones are whatever the loading model was built with.

HF export
    ``export_hf`` writes a state dict gathered on rank 0 (``full_state_dict``) as a folder that
    ``from_pretrained`` (and SGLang's ``update_weights_from_disk``) loads: ``config.json``,
    ``model.safetensors`` and the tokenizer/generation files copied from the source folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from transformers import AutoConfig

from core.training.distributed import barrier, is_initialized, is_main

logger = logging.getLogger(__name__)

# Files of a HF model folder that export_hf writes itself instead of copying.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
_OWN_FILES = {"config.json"}


def _no_dist() -> bool:
    return not is_initialized()


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    """DCP warns on every no-process-group save/load; here that mode is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled", category=UserWarning
        )
        yield


def _trainable(model: nn.Module, model_sd: dict[str, Any]) -> dict[str, Any]:
    names = {name for name, param in model.named_parameters() if param.requires_grad}
    return {key: value for key, value in model_sd.items() if key in names}


def save_state(
    url: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    meta: dict[str, Any],
    *,
    trainable_only: bool = False,
) -> None:
    """Write a sharded checkpoint to ``url`` (collective: every rank calls it)."""
    fresh_optimizer = not optimizer.state
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {
        "model": _trainable(model, model_sd) if trainable_only else model_sd,
        "optim": optim_sd,
        "scheduler": scheduler.state_dict(),
        # DCP restores only keys the loading template has, so free-form data travels as JSON.
        "meta": {"json": json.dumps(meta)},
    }
    with _single_process_ok():
        dcp.save(state, checkpoint_id=url, no_dist=_no_dist())
    if fresh_optimizer:
        # get_state_dict initialised AdamW's state with a zero-lr step (step count 1); undo it
        # so that saving before the first update does not change the bias correction after.
        optimizer.state.clear()
    logger.info("saved checkpoint to %s", url)


def read_meta(url: str) -> dict[str, Any]:
    """The ``meta`` dict of the checkpoint at ``url`` alone (collective)."""
    if not checkpoint_complete(url):
        raise FileNotFoundError(f"no complete checkpoint at {url} (missing .metadata)")
    state = {"meta": {"json": ""}}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=url, no_dist=_no_dist())
    return json.loads(state["meta"]["json"])


def load_state(
    url: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    trainable_only: bool = False,
) -> dict[str, Any]:
    """Load a checkpoint written by ``save_state`` in place; returns its ``meta`` dict."""
    if not checkpoint_complete(url):
        raise FileNotFoundError(f"no complete checkpoint at {url} (missing .metadata)")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {
        "model": _trainable(model, model_sd) if trainable_only else model_sd,
        "optim": optim_sd,
        "scheduler": scheduler.state_dict(),
        "meta": {"json": ""},
    }
    with _single_process_ok():
        dcp.load(state, checkpoint_id=url, no_dist=_no_dist())
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        # the frozen parameters are absent on purpose; DCP has checked the trainable ones
        options=StateDictOptions(strict=not trainable_only),
    )
    scheduler.load_state_dict(state["scheduler"])
    logger.info("loaded checkpoint from %s", url)
    return json.loads(state["meta"]["json"])


def checkpoint_complete(url: str) -> bool:
    """True when ``url`` holds a finished DCP checkpoint (its ``.metadata`` is written last)."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(f"{path.rstrip('/')}/.metadata")


def checkpoint_problems(url: str) -> list[str]:
    """What makes the DCP checkpoint at ``url`` unloadable, without loading it: a missing or
    unreadable ``.metadata``, or a shard file missing or shorter than the metadata says."""
    if not checkpoint_complete(url):
        return [f"{url}: no .metadata (torn write)"]
    fs, path = fsspec.core.url_to_fs(url)
    path = path.rstrip("/")
    try:
        reader = FsspecReader(url) if "://" in url else dcp.FileSystemReader(path)
        metadata = reader.read_metadata()
    except Exception as err:  # noqa: BLE001 - any unpickling failure means "corrupt"
        return [f"{url}/.metadata unreadable: {type(err).__name__}: {err}"]
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    problems = []
    for name, end in sorted(needed.items()):
        file = f"{path}/{name}"
        size = fs.size(file) if fs.exists(file) else None
        if size is None:
            problems.append(f"{url}/{name} is missing")
        elif size < end:
            problems.append(f"{url}/{name} is truncated ({size} of {end} bytes)")
    return problems


def hf_folder_problems(url: str) -> list[str]:
    """What makes the HF export at ``url`` unloadable: config.json not JSON, or
    model.safetensors missing, with a bad header, or shorter than its header says."""
    fs, path = fsspec.core.url_to_fs(url)
    path = path.rstrip("/")
    try:
        with fs.open(f"{path}/config.json", "r") as f:
            json.load(f)
    except (OSError, ValueError) as err:
        return [f"{url}/config.json unreadable: {err}"]
    weights = f"{path}/model.safetensors"
    try:
        with fs.open(weights, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        size = fs.size(weights)
    except (OSError, ValueError) as err:
        return [f"{url}/model.safetensors unreadable: {err}"]
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size < 8 + n + end:
        return [f"{url}/model.safetensors is truncated ({size} of {8 + n + end} bytes)"]
    return []


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full CPU state dict on rank 0, ``{}`` elsewhere (collective: every rank calls it)."""
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return state if is_main() else {}


def export_hf(
    state: dict[str, torch.Tensor],
    source_dir: str | Path,
    directory: str | Path,
    *,
    dtype: torch.dtype,
    extra: Callable[[Path], None] | None = None,
) -> None:
    """Rank 0 writes ``state`` (its ``full_state_dict``) as a ``from_pretrained`` folder; all
    ranks return once it is complete (collective).

    The folder is assembled next to ``directory`` and renamed into place, so a reader never
    sees a half-written export; ``extra(staging)`` adds files to it first (the LoRA adapter).
    """
    if is_main():
        _write_hf_folder(state, Path(source_dir), Path(directory), dtype, extra)
    barrier()


def _write_hf_folder(
    state: dict[str, torch.Tensor],
    source_dir: Path,
    directory: Path,
    dtype: torch.dtype,
    extra: Callable[[Path], None] | None,
) -> None:
    config = AutoConfig.from_pretrained(str(source_dir))
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # it *is* the input embedding; loaders re-tie it
    config.dtype = dtype
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        config.save_pretrained(str(staging))
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        for item in source_dir.iterdir():
            if (
                item.is_file()
                and item.name not in _OWN_FILES
                and not item.name.endswith(_WEIGHT_SUFFIXES)
            ):
                shutil.copy2(item, staging / item.name)
        if extra is not None:
            extra(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; engines may run as another user
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("exported HF model to %s", directory)
