"""Our :class:`~core.inference.engine.hf_engine.HFEngine` behind SGLang's native HTTP API.

The same client (:class:`~core.inference.clients.sglang_client.SGLangClient`) talks to this server on a
CPU box and to a real SGLang server on a GPU node. Endpoints and field shapes follow SGLang
(``python -m sglang.launch_server ... --skip-tokenizer-init``):

- ``POST /generate`` ``{"input_ids", "sampling_params", "return_logprob", "rid", ...}`` ->
  ``{"text", "output_ids", "meta_info": {"id", "finish_reason", ..., "output_token_logprobs"}}``
  (:mod:`core.inference.server.generate_endpoint`). SGLang's whole ``GenerateReqInput`` and
  ``sampling_params`` schema is accepted; what is honoured, and which features are refused
  unless at their defaults, is in :mod:`core.inference.server.sglang_params`. ``input_ids`` may be a
  list of prompts (batch) and ``n`` asks for several samples of each; the answer is then a list.
  ``sampling_params["sampling_seed"]`` (an integer) is the request's ``SamplingParams.seed``.
  ``priority`` (an integer, or one per prompt) orders the waiting requests as SGLang does: only
  with ``--enable-priority-scheduling``, higher values first unless
  ``--schedule-low-priority-values-first`` (the rollout's own order: oldest group first).
- ``POST /pause_generation`` ``{"mode": "abort"|"retract"|"in_place"}``,
  ``POST /continue_generation``.
- ``POST /update_weights_from_disk`` ``{"model_path", "abort_all_requests", "weight_version"}``
  -> ``{"success", "message", "num_paused_requests"}``.
- ``POST /init_weights_update_group`` ``{"master_address", "master_port", "rank_offset",
  "world_size", "group_name", "backend"}``, ``POST /update_weights_from_distributed``
  ``{"names", "dtypes", "shapes", "group_name", "flush_cache", "abort_all_requests",
  "weight_version", "load_format"}``, ``POST /destroy_weights_update_group`` ``{"group_name"}``
  -> ``{"success", "message"}``: SGLang's weight update by broadcast from the learner's rank 0
  over a process group of its own (see :mod:`core.inference.server.weight_sync_endpoints`).
- ``POST /v1/chat/completions``: the OpenAI chat API for agent code (see
  :mod:`core.inference.server.chat_endpoint`; needs a tokenizer with a chat template).
- ``GET /health``, ``GET /get_model_info``, ``GET /get_weight_version``,
  ``GET /get_server_info`` (engine statistics here).

Weight versions are strings in SGLang; ours are integers sent as strings. The command line
accepts SGLang's launch flags, so :mod:`core.inference.clients.sglang_launcher` can start either.

Robustness and security:

- Every request body is validated before it reaches the engine (:mod:`core.inference.server.validation`
  lists the rules): a bad field is a 400 naming the field, and never fails the other requests
  decoded in the same batch. ``max_new_tokens`` is capped by the context left after the prompt
  (``max_position_embeddings``) and by ``--max-new-tokens-cap`` if given. Large bodies are parsed
  off the event loop; an unexpected error is a JSON 500 for that request only.
- ``--api-key`` (or ``$ASYNCRL_ENGINE_API_KEY``): every endpoint but ``/health`` and
  ``/health_generate`` (liveness probes, which reveal nothing) then needs
  ``Authorization: Bearer <key>``, as with SGLang's own ``--api-key``; else 401. Binding a
  non-loopback host without a key is refused at start-up: anyone reaching the port could pause
  the server or swap its weights.
- ``/update_weights_from_disk`` loads only folders under the weight roots: the model folder's
  parent plus every ``--weights-root`` (symlinks resolved first); anything else is a 400. A
  ``--weights-root`` may be a URL (``s3://bucket/run/weights``): a ``model_path`` under it is
  fetched with fsspec to a temporary folder, then loaded (no shared disk with the learner). A
  ``weight_version`` must move forward: greater than the version served, or equal to it with the
  same folder (a retried update, reloaded). Going backwards is a 409; negative versions and
  versions above ``MAX_WEIGHT_VERSION`` are a 400. Our extension ``"reset_version": true``
  accepts any given version: a run's first weights (fresh, or resumed from a checkpoint) on a
  server that served another run or later versions. ``--weight-version`` (SGLang's flag) sets the
  version the launch weights are served as.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from core.inference.api import WeightSource
from core.inference.engine.hf_engine import DEFAULT_PREFIX_CACHE_TOKENS, GenerationError, HFEngine
from core.inference.server.chat_endpoint import chat_completion, parse_chat
from core.inference.server.generate_endpoint import generate_answers
from core.inference.server.guard import (
    API_KEY_ENV,
    SETTINGS_KEY,
    ServerSettings,
    allowed_weights_source,
    authenticate,
    check_exposure,
    clean_api_key,
    make_settings,
    next_version,
)
from core.inference.server.sglang_params import parse_generate
from core.inference.server.validation import RequestError, loads, parse_pause, parse_update
from core.inference.server.weight_sync_endpoints import add_weight_sync_routes
from core.storage import download_dir

logger = logging.getLogger(__name__)

INLINE_PARSE_BYTES = 256 * 1024  # larger bodies are parsed and validated on a worker thread
T = TypeVar("T")


ENGINE_KEY = web.AppKey("engine", HFEngine)
STATE_KEY = web.AppKey("state", dict)


def _error(status: int, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status, headers=headers)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Bad requests -> 400 with the field; anything unexpected -> a JSON 500 for this request."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except RequestError as exc:
        return _error(exc.status, str(exc))
    except GenerationError as exc:
        logger.warning("%s %s: %s", request.method, request.path, exc)
        return _error(500, str(exc))
    except Exception as exc:
        logger.exception("%s %s failed", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}")


async def _parse(request: web.Request, parser: Callable[[Any], T], allow_empty: bool = False) -> T:
    """Read, decode and validate the body; large bodies off the event loop."""
    raw = await request.read()
    if not raw and allow_empty:  # no body at all (JSON null is a malformed one)
        return parser({})
    if len(raw) <= INLINE_PARSE_BYTES:
        return parser(loads(raw))
    return await asyncio.to_thread(lambda: parser(loads(raw)))


# ---------------------------------------------------------------------- /generate


async def generate(request: web.Request) -> web.Response:
    """SGLang's ``/generate`` (see :mod:`core.inference.server.generate_endpoint`)."""
    settings = request.app[SETTINGS_KEY]
    batch = await _parse(request, lambda body: parse_generate(body, settings.limits))
    answers = await generate_answers(request.app[ENGINE_KEY], batch, settings.priority_sign)
    return web.json_response(answers)


async def chat_completions(request: web.Request) -> web.Response:
    """OpenAI ``POST /v1/chat/completions`` (see :mod:`core.inference.server.chat_endpoint`)."""
    limits = request.app[SETTINGS_KEY].limits
    body = await _parse(request, lambda raw: parse_chat(raw, limits))
    model = request.app[STATE_KEY]["model_path"]
    return web.json_response(await chat_completion(request.app[ENGINE_KEY], limits, body, model))


# ---------------------------------------------------------------------- admin endpoints


async def pause_generation(request: web.Request) -> web.Response:
    mode = await _parse(request, parse_pause, allow_empty=True)
    await request.app[ENGINE_KEY].pause(mode)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    await request.app[ENGINE_KEY].resume()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


def _update_failure(status: int, message: str) -> web.Response:
    body = {"success": False, "message": message, "num_paused_requests": 0}
    return web.json_response({**body, "error": {"message": message}}, status=status)


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """Pause (abort or drain in-flight requests), load, bump the version, resume if we paused.

    Like SGLang, without ``abort_all_requests`` in-flight requests finish on the old weights
    first; a server paused by ``/pause_generation`` stays paused until ``/continue_generation``.
    """
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    try:
        update = await _parse(request, parse_update)
        path = allowed_weights_source(update.model_path, request.app[SETTINGS_KEY])
    except RequestError as exc:
        return _update_failure(exc.status, str(exc))
    async with state["update_lock"]:
        try:
            version = next_version(
                engine.version, update.weight_version, path, state["weights_path"],
                update.reset_version,
            )  # fmt: skip
            await _load(engine, path, version, update.abort_all_requests)
        except RequestError as exc:
            return _update_failure(exc.status, str(exc))
        except (OSError, ValueError, RuntimeError) as exc:
            logger.warning("weight update from %s failed: %s", path, exc)
            return _update_failure(400, f"Failed to update weights: {exc}")
        state["model_path"], state["weights_path"] = update.model_path, path
    message = f"Succeeded to update model weights (version {version})."
    return web.json_response({"success": True, "message": message, "num_paused_requests": 0})


async def _load(engine: HFEngine, path: Path | str, version: int, abort: bool) -> None:
    """Load ``path`` (a URL is fetched to a temporary folder first, while generation goes on)."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-weights-") as staging:
        if isinstance(path, str):
            path = await asyncio.to_thread(download_dir, path, staging)
        paused_here = not engine.paused
        if paused_here:
            await engine.pause("abort" if abort else "drain")
        try:
            await engine.update_weights(WeightSource(path=str(path)), version)
        finally:
            if paused_here:
                await engine.resume()


# ---------------------------------------------------------------------- read-only endpoints


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def get_model_info(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    return web.json_response({
        "model_path": state["model_path"],
        "tokenizer_path": state["model_path"],
        "is_generation": True,
        "weight_version": str(request.app[ENGINE_KEY].version),
    })  # fmt: skip


async def get_weight_version(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": str(request.app[ENGINE_KEY].version)})


async def get_server_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    limits = request.app[SETTINGS_KEY].limits
    return web.json_response({
        "model_path": request.app[STATE_KEY]["model_path"],
        "weight_version": str(engine.version),
        "paused": engine.paused,
        "max_batch_size": engine.max_batch_size,
        "context_length": limits.context_length,
        "max_new_tokens_cap": limits.max_new_tokens_cap,
        "engine_stats": engine.stats.as_dict(),
    })  # fmt: skip


def create_app(
    engine: HFEngine, model_path: str, settings: ServerSettings | None = None
) -> web.Application:
    """The aiohttp application serving ``engine`` (which the caller owns and closes).

    ``settings`` default: no API key, weight roots = ``model_path``'s parent, no extra cap.
    """
    settings = settings or make_settings(engine, model_path or None)
    app = web.Application(client_max_size=64 * 1024**2, middlewares=[_errors, authenticate])
    app[ENGINE_KEY] = engine
    app[SETTINGS_KEY] = settings
    loaded = Path(model_path).expanduser().resolve() if model_path else None
    app[STATE_KEY] = {
        "model_path": str(model_path),
        "weights_path": loaded,
        "update_lock": asyncio.Lock(),
    }
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    add_weight_sync_routes(app, engine, app[STATE_KEY])
    for path, handler in [
        ("/health", health),
        ("/health_generate", health),
        ("/get_model_info", get_model_info),
        ("/get_weight_version", get_weight_version),
        ("/get_server_info", get_server_info),
    ]:
        app.router.add_get(path, handler)
    return app


@dataclass
class ServerHandle:
    """A server started by :func:`start_server`; ``await handle.stop()`` shuts it down."""

    runner: web.AppRunner
    engine: HFEngine
    host: str
    port: int
    owns_engine: bool

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()
        if self.owns_engine:
            await asyncio.to_thread(self.engine.close)


async def start_server(
    model_dir: str | Path | None = None,
    *,
    engine: HFEngine | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    weights_root: Iterable[str | Path] = (),
    max_new_tokens_cap: int | None = None,
    priorities: str = "off",
    **engine_kwargs: Any,
) -> ServerHandle:
    """Serve ``engine`` (or a new one from ``model_dir``) on the running loop; ``port=0`` = free port.

    ``api_key``: required on every endpoint but health (and to bind a non-loopback ``host``);
    ``weights_root``: folders weight updates may load from, besides ``model_dir``'s parent;
    ``max_new_tokens_cap``: the most tokens one request may ask for (besides the context's limit);
    ``priorities``: what a request's ``priority`` does: ``off``, ``low-first``, ``high-first``.
    """
    check_exposure(host, clean_api_key(api_key))
    owns_engine = engine is None
    if engine is None:
        if model_dir is None:
            raise ValueError("start_server needs model_dir or engine")
        engine = await asyncio.to_thread(HFEngine.from_pretrained, model_dir, **engine_kwargs)
    settings = make_settings(
        engine, model_dir, api_key=api_key, weights_root=weights_root,
        max_new_tokens_cap=max_new_tokens_cap, priorities=priorities,
    )  # fmt: skip
    runner = web.AppRunner(create_app(engine, str(model_dir or ""), settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    logger.info("serving %s on http://%s:%d", model_dir, host, bound_port)
    return ServerHandle(runner, engine, host, bound_port, owns_engine)


def serve(
    model_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 30000,
    *,
    api_key: str | None = None,
    weights_root: Iterable[str | Path] = (),
    max_new_tokens_cap: int | None = None,
    priorities: str = "off",
    **engine_kwargs: Any,
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); blocking. Arguments as :func:`start_server`'s."""
    check_exposure(host, clean_api_key(api_key))
    engine = HFEngine.from_pretrained(model_dir, **engine_kwargs)
    settings = make_settings(
        engine, model_dir, api_key=api_key, weights_root=weights_root,
        max_new_tokens_cap=max_new_tokens_cap, priorities=priorities,
    )  # fmt: skip
    app = create_app(engine, str(model_dir), settings)

    async def close_engine(_: web.Application) -> None:
        await asyncio.to_thread(engine.close)

    app.on_cleanup.append(close_engine)
    logger.info(
        "serving %s on http://%s:%d (API key %s; weight roots %s)", model_dir, host, port,
        "required" if settings.api_key else "off", [str(r) for r in settings.weights_roots],
    )  # fmt: skip
    web.run_app(app, host=host, port=port, print=None, access_log=None)


_DTYPES = {"auto": "float32", "float": "float32", "float32": "float32", "half": "float16",
           "float16": "float16", "bfloat16": "bfloat16"}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Our flags plus SGLang's launch flags (so a launcher can start either server)."""
    p = argparse.ArgumentParser(
        prog="python -m core.inference.server", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", "--model-path", dest="model", required=True, help="HF model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="auto", choices=sorted(_DTYPES))
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    p.add_argument(
        "--max-batch-size", "--max-running-requests", dest="max_batch_size", type=int, default=128
    )
    p.add_argument("--chunk-tokens", type=int, default=16)
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=DEFAULT_PREFIX_CACHE_TOKENS,
        help="tokens of finished requests' KV cache kept for requests that continue them "
        "(an agent's next call); 0 = off",
    )
    p.add_argument(
        "--kv-after-update",
        choices=("recompute", "keep"),
        default="recompute",
        help="kept KV caches when new weights load: drop them (recompute) or let conversations "
        "go on with them (keep; PipelineRL's in-flight update)",
    )
    p.add_argument("--seed", "--random-seed", dest="seed", type=int, default=0)
    p.add_argument(
        "--weight-version",
        type=int,
        default=0,
        help="the version the launch weights are served as (a run resumed at version N launches "
        "its servers from that checkpoint at N)",
    )
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"bearer token required on every endpoint but /health (default: ${API_KEY_ENV}); "
        "required to bind a non-loopback host",
    )
    p.add_argument(
        "--weights-root",
        action="append",
        default=[],
        help="a folder /update_weights_from_disk may load from (repeatable; the model folder's "
        "parent is always allowed)",
    )
    p.add_argument(
        "--max-new-tokens-cap",
        type=int,
        default=None,
        help="most tokens one request may generate (default: the context left after the prompt)",
    )
    p.add_argument(
        "--enable-priority-scheduling",
        action="store_true",
        help="SGLang flag: serve waiting requests by their 'priority' (else first come, first "
        "served), higher values first unless --schedule-low-priority-values-first",
    )
    p.add_argument("--schedule-low-priority-values-first", action="store_true")
    p.add_argument("--tp-size", type=int, default=1, help="SGLang flag; must be 1 here")
    p.add_argument("--mem-fraction-static", type=float, default=None, help="SGLang flag; ignored")
    p.add_argument(
        "--skip-tokenizer-init", action="store_true", help="SGLang flag; always true here"
    )
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.tp_size != 1:
        p.error("--tp-size must be 1: this server runs one in-process model")
    if args.max_new_tokens_cap is not None and args.max_new_tokens_cap < 1:
        p.error("--max-new-tokens-cap must be >= 1")
    if args.weight_version < 0:
        p.error("--weight-version must be >= 0")
    if args.prefix_cache_tokens < 0:
        p.error("--prefix-cache-tokens must be >= 0")
    try:
        check_exposure(args.host, clean_api_key(args.api_key))
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    serve(
        args.model, args.host, args.port, api_key=args.api_key, weights_root=args.weights_root,
        max_new_tokens_cap=args.max_new_tokens_cap, dtype=_DTYPES[args.dtype], device=args.device,
        max_batch_size=args.max_batch_size, chunk_tokens=args.chunk_tokens, seed=args.seed,
        torch_threads=args.torch_threads, version=args.weight_version,
        prefix_cache_tokens=args.prefix_cache_tokens,
        keep_kv_on_update=args.kv_after_update == "keep",
        priorities=priority_mode(args),
    )  # fmt: skip


def priority_mode(args: argparse.Namespace) -> str:
    """SGLang's two priority flags as :func:`start_server`'s ``priorities``."""
    if not args.enable_priority_scheduling:
        return "off"
    return "low-first" if args.schedule_low_priority_values_first else "high-first"


if __name__ == "__main__":
    main()
