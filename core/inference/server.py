"""Our :class:`~core.inference.hf_engine.HFEngine` behind SGLang's native HTTP API.

The same client (:class:`~core.inference.sglang_client.SGLangClient`) talks to this server on a
CPU box and to a real SGLang server on a GPU node. Endpoints and field shapes follow SGLang
(``python -m sglang.launch_server ... --skip-tokenizer-init``):

- ``POST /generate`` ``{"input_ids", "sampling_params", "return_logprob", "rid"}`` ->
  ``{"output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
  "cached_tokens", "weight_version", "e2e_latency", "output_token_logprobs"}}`` with
  ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples and ``finish_reason`` as
  ``{"type": "stop", "matched": id}`` / ``{"type": "length", "length": n}`` /
  ``{"type": "abort", "message": ...}``. Our extension: ``meta_info["output_token_versions"]``.
  ``input_ids`` may be a list of prompts (batch); the answer is then a list.
  ``sampling_params["sampling_seed"]`` (an integer) is the request's ``SamplingParams.seed``.
- ``POST /pause_generation`` ``{"mode": "abort"|"retract"|"in_place"}``,
  ``POST /continue_generation``.
- ``POST /update_weights_from_disk`` ``{"model_path", "abort_all_requests", "weight_version"}``
  -> ``{"success", "message", "num_paused_requests"}``.
- ``GET /health``, ``GET /get_model_info``, ``GET /get_weight_version``,
  ``GET /get_server_info`` (engine statistics here).

Weight versions are strings in SGLang; ours are integers sent as strings. The command line
accepts SGLang's launch flags, so :mod:`core.inference.sglang_launcher` can start either.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from core.inference.api import GenerationRequest, GenerationResponse, SamplingParams, WeightSource
from core.inference.hf_engine import HFEngine

logger = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", HFEngine)
STATE_KEY = web.AppKey("state", dict)
_PAUSE_MODES = {"abort": "abort", "retract": "retract", "in_place": "retract"}
# Our engine re-prefills a retracted request, which is what SGLang's "in_place" amounts to.


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def parse_sampling(raw: dict[str, Any] | None) -> SamplingParams:
    """SGLang ``sampling_params`` -> ours (SGLang's ``top_k=-1`` means off, as our 0 does)."""
    raw = dict(raw or {})
    if raw.get("stop"):
        raise ValueError("'stop' strings need a tokenizer; use stop_token_ids")
    top_k = int(raw.get("top_k", -1))
    return SamplingParams(
        max_new_tokens=int(raw.get("max_new_tokens", 128)),
        temperature=float(raw.get("temperature", 1.0)),
        top_p=float(raw.get("top_p", 1.0)),
        top_k=max(top_k, 0),
        stop_token_ids=[int(t) for t in raw.get("stop_token_ids") or []],
        seed=_parse_seed(raw.get("sampling_seed")),
    )


def _parse_seed(raw: Any) -> int | None:
    """SGLang's ``sampling_seed``: a JSON integer or null. No coercion: ``"7"`` or ``7.5`` would
    silently become some other seed than the caller meant (and ``true`` is no seed at all)."""
    if raw is None:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise ValueError(f"sampling_seed={raw!r} must be an integer")
    return raw


def finish_reason(resp: GenerationResponse) -> dict[str, Any]:
    if resp.stop_reason == "stop":
        return {"type": "stop", "matched": resp.output_ids[-1]}
    if resp.stop_reason == "length":
        return {"type": "length", "length": len(resp.output_ids)}
    return {"type": "abort", "message": "generation paused for a weight update"}


def to_sglang(
    resp: GenerationResponse, rid: str, n_prompt: int, version: int, logprobs: bool, latency: float
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason(resp),
        "prompt_tokens": n_prompt,
        "completion_tokens": len(resp.output_ids),
        "cached_tokens": 0,
        "weight_version": str(version),
        "e2e_latency": latency,
        "output_token_versions": resp.versions,
    }
    if logprobs:
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(resp.logprobs, resp.output_ids, strict=True)
        ]
    return {"output_ids": resp.output_ids, "meta_info": meta}


async def _generate_one(
    engine: HFEngine, ids: list[int], sampling: dict, rid: str | None, logprobs: bool
):
    rid = rid or uuid.uuid4().hex
    start = time.perf_counter()
    resp = await engine.agenerate(GenerationRequest(list(ids), parse_sampling(sampling), rid))
    return to_sglang(resp, rid, len(ids), engine.version, logprobs, time.perf_counter() - start)


async def generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await request.json()
    input_ids = body.get("input_ids")
    if not input_ids:
        return _error(400, "this server has no tokenizer (skip_tokenizer_init): send input_ids")
    logprobs = bool(body.get("return_logprob", False))
    sampling, rid = body.get("sampling_params"), body.get("rid")
    try:
        if isinstance(input_ids[0], list):  # a batch of prompts
            n = len(input_ids)
            samplings = sampling if isinstance(sampling, list) else [sampling] * n
            rids = (
                rid if isinstance(rid, list) else [f"{rid}_{i}" if rid else None for i in range(n)]
            )
            coros = [
                _generate_one(engine, ids, s, r, logprobs)
                for ids, s, r in zip(input_ids, samplings, rids, strict=True)
            ]
            return web.json_response(list(await asyncio.gather(*coros)))
        return web.json_response(await _generate_one(engine, input_ids, sampling, rid, logprobs))
    except (ValueError, TypeError) as exc:
        return _error(400, str(exc))


async def pause_generation(request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    mode = _PAUSE_MODES.get(body.get("mode", "abort"))
    if mode is None:
        return _error(400, f"mode must be one of {sorted(_PAUSE_MODES)}")
    await request.app[ENGINE_KEY].pause(mode)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    await request.app[ENGINE_KEY].resume()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """Pause (abort or drain in-flight requests), load, bump the version, resume if we paused.

    Like SGLang, without ``abort_all_requests`` in-flight requests finish on the old weights
    first; a server paused by ``/pause_generation`` stays paused until ``/continue_generation``.
    """
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    body = await request.json()
    if not body.get("model_path"):
        return _error(400, "model_path is required")
    raw_version = body.get("weight_version")
    try:
        version = engine.version + 1 if raw_version is None else int(raw_version)
    except ValueError:
        return _error(400, f"weight_version={raw_version!r}: this server uses integer versions")
    async with state["update_lock"]:
        paused_here = not engine.paused
        if paused_here:
            await engine.pause("abort" if body.get("abort_all_requests") else "drain")
        try:
            await engine.update_weights(WeightSource(path=body["model_path"]), version)
        except (OSError, ValueError, RuntimeError) as exc:
            logger.warning("weight update from %s failed: %s", body["model_path"], exc)
            return web.json_response(
                {
                    "success": False,
                    "message": f"Failed to update weights: {exc}",
                    "num_paused_requests": 0,
                },
                status=400,
            )
        finally:
            if paused_here:
                await engine.resume()
    state["model_path"] = body["model_path"]
    message = f"Succeeded to update model weights (version {version})."
    return web.json_response({"success": True, "message": message, "num_paused_requests": 0})


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
    return web.json_response({
        "model_path": request.app[STATE_KEY]["model_path"],
        "weight_version": str(engine.version),
        "paused": engine.paused,
        "max_batch_size": engine.max_batch_size,
        "engine_stats": engine.stats.as_dict(),
    })  # fmt: skip


def create_app(engine: HFEngine, model_path: str) -> web.Application:
    """The aiohttp application serving ``engine`` (which the caller owns and closes)."""
    app = web.Application(client_max_size=64 * 1024**2)
    app[ENGINE_KEY] = engine
    app[STATE_KEY] = {"model_path": str(model_path), "update_lock": asyncio.Lock()}
    app.router.add_post("/generate", generate)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
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
    **engine_kwargs: Any,
) -> ServerHandle:
    """Serve ``engine`` (or a new one from ``model_dir``) on the running loop; ``port=0`` = free port."""
    owns_engine = engine is None
    if engine is None:
        if model_dir is None:
            raise ValueError("start_server needs model_dir or engine")
        engine = await asyncio.to_thread(HFEngine.from_pretrained, model_dir, **engine_kwargs)
    runner = web.AppRunner(create_app(engine, str(model_dir or "")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    logger.info("serving %s on http://%s:%d", model_dir, host, bound_port)
    return ServerHandle(runner, engine, host, bound_port, owns_engine)


def serve(
    model_dir: str | Path, host: str = "127.0.0.1", port: int = 30000, **engine_kwargs: Any
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM); blocking."""
    engine = HFEngine.from_pretrained(model_dir, **engine_kwargs)
    app = create_app(engine, str(model_dir))

    async def close_engine(_: web.Application) -> None:
        await asyncio.to_thread(engine.close)

    app.on_cleanup.append(close_engine)
    logger.info("serving %s on http://%s:%d", model_dir, host, port)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


_DTYPES = {"auto": "float32", "float": "float32", "float32": "float32", "half": "float16",
           "float16": "float16", "bfloat16": "bfloat16"}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Our flags plus SGLang's launch flags (so a launcher can start either server)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", "--model-path", dest="model", required=True, help="HF model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="auto", choices=sorted(_DTYPES))
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda if available)")
    p.add_argument(
        "--max-batch-size", "--max-running-requests", dest="max_batch_size", type=int, default=128
    )
    p.add_argument("--chunk-tokens", type=int, default=16)
    p.add_argument("--seed", "--random-seed", dest="seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=None)
    p.add_argument("--tp-size", type=int, default=1, help="SGLang flag; must be 1 here")
    p.add_argument("--mem-fraction-static", type=float, default=None, help="SGLang flag; ignored")
    p.add_argument(
        "--skip-tokenizer-init", action="store_true", help="SGLang flag; always true here"
    )
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.tp_size != 1:
        p.error("--tp-size must be 1: this server runs one in-process model")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    serve(
        args.model, args.host, args.port, dtype=_DTYPES[args.dtype], device=args.device,
        max_batch_size=args.max_batch_size, chunk_tokens=args.chunk_tokens, seed=args.seed,
        torch_threads=args.torch_threads,
    )  # fmt: skip


if __name__ == "__main__":
    main()
