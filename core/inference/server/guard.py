"""What the engine server enforces besides the engine: the API key, the weight roots, the
request limits, and versions that only move forward (see :mod:`core.inference.server`)."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from core.inference.clients.http_client import API_KEY_ENV
from core.inference.engine.hf_engine import HFEngine
from core.inference.engine.weights import local_path
from core.inference.server.validation import MAX_WEIGHT_VERSION, RequestError, RequestLimits
from core.storage import is_local

OPEN_PATHS = frozenset({"/health", "/health_generate"})  # no key needed: liveness probes
PRIORITY_SIGNS = {"off": 0, "low-first": 1, "high-first": -1}


@dataclass(frozen=True)
class ServerSettings:
    """What the server enforces besides the engine: key, weight roots, request limits."""

    api_key: str | None
    weights_roots: tuple[Path, ...]
    limits: RequestLimits
    weights_urls: tuple[
        str, ...
    ] = ()  # remote roots (s3://bucket/run/weights): fetched, then loaded
    # what a request's "priority" does (SGLang's flags): 0 = nothing (first come, first served),
    # 1 = lower values first (--schedule-low-priority-values-first), -1 = higher values first
    priority_sign: int = 0


SETTINGS_KEY = web.AppKey("settings", ServerSettings)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "", "0.0.0.0"-like wildcards parse; other names may resolve anywhere
        return False


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to serve the admin endpoints unauthenticated beyond this machine."""
    if api_key is None and not is_loopback(host):
        raise ValueError(
            f"refusing to bind {host!r} without an API key: anyone reaching the port could pause "
            f"the server or swap its weights. Pass --api-key (or set {API_KEY_ENV}), or bind "
            "127.0.0.1"
        )


def clean_api_key(api_key: str | None) -> str | None:
    if api_key is None or not api_key.strip():
        return None
    key = api_key.strip()
    if any(ord(c) < 33 or ord(c) > 126 for c in key):
        raise ValueError("the API key must be printable ASCII without spaces")
    return key


def weights_roots(
    model_dir: str | Path | None, extra: Iterable[str | Path] = ()
) -> tuple[Path, ...]:
    """The folders weight updates may load from: ``model_dir``'s parent plus the local ``extra``."""
    roots = [Path(r).expanduser().resolve() for r in extra if is_local(str(r))]
    if model_dir:
        roots.insert(0, Path(model_dir).expanduser().resolve().parent)
    return tuple(dict.fromkeys(roots))


def make_settings(
    engine: HFEngine,
    model_dir: str | Path | None,
    *,
    api_key: str | None = None,
    weights_root: Iterable[str | Path] = (),
    max_new_tokens_cap: int | None = None,
    priorities: str = "off",
) -> ServerSettings:
    """The settings for serving ``engine`` loaded from ``model_dir`` (see :func:`start_server`)."""
    if priorities not in PRIORITY_SIGNS:
        raise ValueError(f"priorities={priorities!r}: one of {sorted(PRIORITY_SIGNS)}")
    if max_new_tokens_cap is not None and max_new_tokens_cap < 1:
        raise ValueError(f"max_new_tokens_cap={max_new_tokens_cap} must be >= 1")
    limits = RequestLimits(
        vocab_size=engine.vocab_size,
        context_length=engine.context_length,
        max_new_tokens_cap=max_new_tokens_cap,
        stop_strings=getattr(engine, "tokenizer", None) is not None,
    )
    weights_root = list(weights_root)
    urls = tuple(str(r).rstrip("/") for r in weights_root if not is_local(str(r)))
    return ServerSettings(
        clean_api_key(api_key), weights_roots(model_dir, weights_root), limits, urls,
        PRIORITY_SIGNS[priorities],
    )  # fmt: skip


@web.middleware
async def authenticate(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    key = request.app[SETTINGS_KEY].api_key
    if key is None or request.path in OPEN_PATHS:
        return await handler(request)
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    given = token.strip().encode("utf-8", "replace")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, key.encode()):
        message = "missing or invalid API key: send 'Authorization: Bearer <key>'"
        return web.json_response(
            {"error": {"message": message}}, status=401, headers={"WWW-Authenticate": "Bearer"}
        )
    return await handler(request)


def allowed_weights_source(raw: str, settings: ServerSettings) -> Path | str:
    """A local folder (as :func:`allowed_weights_path`) or a URL under a remote weight root:
    a learner on another node without a shared disk publishes to ``s3://...``."""
    if is_local(raw):
        return allowed_weights_path(raw, settings.weights_roots)
    if ".." in raw.split("/") or not any(
        raw.rstrip("/").startswith(root + "/") for root in settings.weights_urls
    ):
        shown = ", ".join(settings.weights_urls) or "none"
        raise RequestError(
            "model_path",
            f"{raw} is not under an allowed weight root URL ({shown}); add one with --weights-root",
        )
    return raw.rstrip("/")


def allowed_weights_path(raw: str, roots: tuple[Path, ...]) -> Path:
    """``raw`` resolved (symlinks followed), if it lies under one of ``roots``."""
    try:
        path = local_path(raw).expanduser().resolve()
    except ValueError as exc:
        raise RequestError("model_path", str(exc)) from None
    except (OSError, RuntimeError):
        raise RequestError("model_path", "cannot be resolved") from None
    if not roots:
        raise RequestError("model_path", "no weight roots configured: start with --weights-root")
    if not any(path.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise RequestError(
            "model_path",
            f"{path} is outside the allowed weight roots ({shown}); add one with --weights-root",
        )
    return path


def next_version(
    current: int,
    requested: int | None,
    path: Path | str | None,
    loaded: Path | str | None,
    reset: bool = False,
) -> int:
    """The version an update gets: it must move forward (equal = a retry of the same folder).

    ``reset`` (a run starting or resuming: its first weights) accepts any given version.
    """
    if reset:
        if requested is None:
            raise RequestError("weight_version", "reset_version needs an explicit weight_version")
        return requested
    if requested is None:
        requested = current + 1
        if requested > MAX_WEIGHT_VERSION:
            raise RequestError("weight_version", f"no version after {current}")
    if requested > current or (requested == current and path == loaded):
        return requested
    raise RequestError(
        "weight_version",
        f"{requested} does not move forward from the served version {current} "
        "(equal is accepted only to reload the same folder)",
        status=409,
    )
