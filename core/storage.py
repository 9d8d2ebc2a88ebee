"""Run files on any fsspec URL: a local folder or object storage (s3://bucket/prefix).

Model folders must be local for ``from_pretrained``/``save_pretrained``; for a remote fileroot
they are staged in a local cache folder and uploaded with :func:`upload_dir`.

No call waits forever: object-store clients get connect and read timeouts (defaults for every
s3 filesystem fsspec builds, DCP's included; explicit ``storage_options`` win), and the calls
here retry transient errors a bounded number of times with a log line per retry naming the
call. Environment: ``ASYNCRL_STORAGE_CONNECT_TIMEOUT_S`` (10), ``ASYNCRL_STORAGE_READ_TIMEOUT_S``
(20), ``ASYNCRL_STORAGE_ATTEMPTS`` (3): an endpoint that accepts connections and never answers
fails a call after its attempts' read timeouts, with the URL in the error: about two minutes
for an s3 read with the defaults (s3fs sends a HEAD, then a listing when that fails: 3 x 2 x 20 s;
166 s measured for a run's lock). The filesystems these
calls use send each request once (s3fs's own silent five tries are turned off for them, botocore's
too): the only retries are the logged ones, and each opens one connection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from tenacity import (
    RetryCallState,
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = float(os.environ.get("ASYNCRL_STORAGE_CONNECT_TIMEOUT_S", "10"))
READ_TIMEOUT_S = float(os.environ.get("ASYNCRL_STORAGE_READ_TIMEOUT_S", "20"))
ATTEMPTS = int(os.environ.get("ASYNCRL_STORAGE_ATTEMPTS", "3"))

# botocore's own retries off (and s3fs's, in :func:`filesystem`): storage_retry's are the only ones.
_s3_client = fsspec.config.conf.setdefault("s3", {}).setdefault("config_kwargs", {})
_s3_client.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
_s3_client.setdefault("read_timeout", READ_TIMEOUT_S)
_s3_client.setdefault("retries", {"max_attempts": 1})

# Errors that say something about the object, not the connection: retrying cannot help.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
              NotADirectoryError)  # fmt: skip


def _transient(error: BaseException) -> bool:
    return isinstance(error, OSError) and not isinstance(error, _PERMANENT)


class StorageUnavailableError(OSError):
    """A storage call failed on every attempt with transient errors (timeouts, resets)."""


def _give_up(state: RetryCallState) -> None:
    """After the last attempt: an error naming the call, its URL and the attempts made."""
    error = state.outcome.exception() if state.outcome is not None else None
    name = getattr(state.fn, "__name__", "a storage call")
    # the URL: the call's first string argument, else its object's ``url`` (a method's self)
    strings = [a for a in state.args if isinstance(a, str)]
    target = strings[0] if strings else getattr(next(iter(state.args), None), "url", "")
    raise StorageUnavailableError(
        f"storage unreachable: {name}({target!r}) failed {state.attempt_number} times in "
        f"{state.seconds_since_start:.0f} s (ASYNCRL_STORAGE_ATTEMPTS={ATTEMPTS}, each read "
        f"timeout {READ_TIMEOUT_S:g} s, ASYNCRL_STORAGE_READ_TIMEOUT_S); last error: {error}"
    ) from error


storage_retry = retry(
    retry=retry_if_exception(_transient),
    stop=stop_after_attempt(max(1, ATTEMPTS)),
    wait=wait_exponential(multiplier=0.5, max=8),
    before_sleep=before_sleep_log(logger, logging.WARNING),
    retry_error_callback=_give_up,
)
"""Retry a storage call on transient errors (timeouts, dropped connections), logging each; then
:class:`StorageUnavailableError` naming the call and its URL. Errors about the object itself
(not found, permission) are raised at once."""


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of ``url`` (fsspec's cached instance, so connections are pooled),
    sending each request once: its retries are :data:`storage_retry`'s, which are logged."""
    fs, path = url_to_fs(url)
    if getattr(fs, "retries", 1) != 1:  # s3fs: tries per request (5, at debug level)
        fs.retries = 1
    return fs, path


def is_local(url: str) -> bool:
    """True for plain paths and ``file://`` URLs."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> Path:
    """The local folder for ``url``: itself when local, else a stable staging folder."""
    if is_local(url):
        return Path(url.removeprefix("file://"))
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "asyncrl-staging" / digest


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


@storage_retry
def write_text(url: str, text: str) -> None:
    """Write ``text`` to ``url`` whole or not at all. Locally it goes to a temporary file in the
    same folder that is then renamed over the target, so a crash or a full disk mid-write
    leaves the previous file as it was; an object store's PUT is all-or-nothing already."""
    if is_local(url):
        target = local_path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            partial.write_text(text)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return
    fs, path = filesystem(url)
    parent = path.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(path, "w") as f:
        f.write(text)


@storage_retry
def read_text(url: str) -> str:
    """The text at ``url``, read afresh (not from a listing cached by an earlier call)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    with fs.open(path, "r") as f:
        return f.read()


@storage_retry
def remove_file(url: str) -> None:
    """Delete the file at ``url``; FileNotFoundError if there is none."""
    fs, path = filesystem(url)
    fs.rm(path)


def write_json(url: str, data: Any) -> None:
    write_text(url, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl(url: str, rows: list[dict]) -> None:
    write_text(url, "".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(url: str) -> list[dict]:
    return [json.loads(line) for line in read_text(url).splitlines() if line.strip()]


@storage_retry
def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def fetch_dir(source: str) -> str:
    """A local folder with ``source``'s files: ``source`` itself when local, else a download
    into its staging folder (a Ray node without the driver's disk gets weights this way)."""
    return source if is_local(source) else str(download_dir(source))


@storage_retry
def remove_dir(url: str) -> None:
    """Delete the folder at ``url`` and everything under it, if it exists."""
    fs, path = filesystem(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@storage_retry
def upload_dir(local: str | Path, url: str) -> None:
    """Copy a local folder's files to ``url`` (no-op when ``url`` is that folder)."""
    if is_local(url) and Path(local).resolve() == local_path(url).resolve():
        return
    fs, path = filesystem(url)
    fs.makedirs(path, exist_ok=True)
    for file in sorted(Path(local).rglob("*")):
        if file.is_file():
            fs.put_file(str(file), f"{path}/{file.relative_to(local).as_posix()}")


@storage_retry
def upload_file(local: str | Path, url: str) -> None:
    """Copy one local file to ``url`` (no-op when ``url`` is that file)."""
    if is_local(url) and Path(local).resolve() == local_path(url).resolve():
        return
    fs, path = filesystem(url)
    parent = path.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    fs.put_file(str(local), path)


@storage_retry
def download_file(url: str, local: str | Path) -> Path:
    """Copy one file at ``url`` to the local path ``local``; returns it."""
    fs, path = filesystem(url)
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    fs.get_file(path, str(local))
    return Path(local)


@storage_retry
def download_dir(url: str, local: str | Path | None = None) -> Path:
    """Copy the files under ``url`` into ``local`` (default :func:`local_path`); returns the folder.

    A no-op for a local ``url`` with no other destination: the folder is used where it is.
    """
    target = Path(local) if local is not None else local_path(url)
    if is_local(url) and target.resolve() == local_path(url).resolve():
        return target
    fs, path = filesystem(url)
    target.mkdir(parents=True, exist_ok=True)
    fs.get(path.rstrip("/") + "/", str(target) + "/", recursive=True)
    return target
