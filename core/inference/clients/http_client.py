"""What the HTTP engine clients share: server choice, retries, pause state, the weight version.

Routing: a new request goes to the server that last took the same prompt tokens -- the ``G``
samples of a GRPO group land together, so the server computes the prompt once (SGLang's radix
cache, vLLM's prefix cache, our engine's one prefill per group) -- and otherwise to the next
server round-robin, so distinct prompts spread evenly. A resumed request (same ``rid``, see
:func:`~core.inference.api.generate_resuming`) goes back to the server that started it, whose
prefix cache may still help and whose ``rid`` bookkeeping stays in one place. A later call of a
multi-turn conversation (same ``session``) goes where the conversation went, so the server
prefills only its new tokens; routed afresh it would prefill the whole conversation again.

Pausing is enforced on both sides: the client holds back new requests until :meth:`resume`, and
subclasses tell the servers to stop (in-flight requests then come back as ``abort``).

Authentication: with an API key every request carries ``Authorization: Bearer <key>``, which is
what SGLang's and vLLM's ``--api-key`` and our server's expect. The key defaults to
``$ASYNCRL_ENGINE_API_KEY`` when set, so a run reaches key-protected servers without putting the
key in its config (which is logged).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from core.inference.api import WeightSource

logger = logging.getLogger(__name__)

_RETRY_STATUS = {502, 503, 504}  # a server restarting or a proxy in front of one
API_KEY_ENV = "ASYNCRL_ENGINE_API_KEY"
PROMPT_ROUTES = 4096  # recent prompts remembered for routing (a few batches' worth of groups)
SESSION_ROUTES = 16_384  # recent conversations remembered for routing (episodes in flight)
T = TypeVar("T")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer <key>`` when there is a key (``None`` = ``$ASYNCRL_ENGINE_API_KEY``)."""
    key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
    key = (key or "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


class ServerError(RuntimeError):
    """A server answered with an error status."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url} answered {status}: {body[:500]}")
        self.status = status


class ServersDown(RuntimeError):
    """No server is reachable."""


def unreachable(exc: BaseException) -> bool:
    """A server that cannot be reached at all (refused, reset, gone), after the retries."""
    return isinstance(exc, aiohttp.ClientConnectionError) and not isinstance(
        exc, aiohttp.ClientPayloadError
    )


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ServerError):
        return exc.status in _RETRY_STATUS
    return isinstance(exc, aiohttp.ClientConnectionError | TimeoutError)


def normalize_address(address: str) -> str:
    """``host:port`` or a URL -> base URL without a trailing slash."""
    address = address.rstrip("/")
    return address if "://" in address else f"http://{address}"


class HTTPEngineClient:
    """Base of the SGLang and vLLM clients (not an engine by itself)."""

    def __init__(
        self,
        addresses: list[str],
        *,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        version: int = 0,
        api_key: str | None = None,
    ) -> None:
        """``api_key``: bearer token for the servers; None = ``$ASYNCRL_ENGINE_API_KEY``
        if set, "" = send none."""
        if not addresses:
            raise ValueError("need at least one server address")
        self.urls = [normalize_address(a) for a in addresses]
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._version = version
        self._headers = auth_headers(api_key)  # never logged
        self._round_robin = itertools.cycle(range(len(self.urls)))
        self._rid_server: dict[str, int] = {}
        self._prompt_server: OrderedDict[int, int] = OrderedDict()  # hash(prompt) -> server, LRU
        self._session_server: OrderedDict[str, int] = OrderedDict()  # session -> server, LRU
        self._down: set[int] = set()  # unreachable servers, skipped until restore()
        self._paused = False
        self._resume_waiters: list[asyncio.Future] = []
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ state

    @property
    def version(self) -> int:
        return self._version

    @property
    def paused(self) -> bool:
        return self._paused

    async def wait_until_resumed(self) -> None:
        while self._paused:  # a loop: pause() may come again before this waiter runs
            future = asyncio.get_running_loop().create_future()
            self._resume_waiters.append(future)
            await future

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        if not paused:
            waiters, self._resume_waiters = self._resume_waiters, []
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    def server_for(self, rid: str, prompt: Sequence[int] | None = None, session: str = "") -> int:
        """The server index for ``rid``: sticky once chosen; a new one goes where its
        ``session`` went, else where ``prompt`` last went, else round-robin; a request whose
        server went down moves to a live one."""
        index = self._rid_server.get(rid)
        if index is None or index in self._down:
            if len(self._down) >= len(self.urls):
                raise ServersDown(f"no inference server is reachable: {self.urls}")
            key = hash(tuple(prompt)) if prompt is not None else None
            index = self._session_server.get(session) if session else None
            if index is None or index in self._down:
                index = self._prompt_server.get(key) if key is not None else None
            if index is None or index in self._down:
                index = next(i for i in self._round_robin if i not in self._down)
            if key is not None:
                _remember(self._prompt_server, key, index, PROMPT_ROUTES)
            if session:
                _remember(self._session_server, session, index, SESSION_ROUTES)
            self._rid_server[rid] = index
        return index

    @property
    def down(self) -> list[str]:
        """The URLs of servers marked unreachable."""
        return [self.urls[i] for i in sorted(self._down)]

    def mark_down(self, index: int, error: BaseException) -> None:
        if index not in self._down:
            self._down.add(index)
            logger.warning(
                "inference server %s is unreachable (%r): its requests go to the others",
                self.urls[index], error,
            )  # fmt: skip

    def restore(self, addresses: list[str]) -> None:
        """Route to these servers again (restarted, serving the current version)."""
        for address in addresses:
            self._down.discard(self.urls.index(normalize_address(address)))

    async def on_server(
        self,
        rid: str,
        call: Callable[[str], Awaitable[T]],
        prompt: Sequence[int] | None = None,
        session: str = "",
    ) -> T:
        """``call(url)`` on ``rid``'s server (see :meth:`server_for`); when that server is
        unreachable (after the retries) it is marked down and the request goes, whole, to a live
        one. The last live server is never marked down: its error is raised (the caller's
        episode fails)."""
        while True:
            index = self.server_for(rid, prompt, session)
            try:
                return await call(self.urls[index])
            except Exception as exc:
                last_live = index not in self._down and len(self._down) + 1 >= len(self.urls)
                if not unreachable(exc) or last_live:
                    raise
                self.mark_down(index, exc)  # other requests may have marked it already

    def release(self, rid: str) -> None:
        """Forget ``rid`` once its request finished for good (not aborted)."""
        self._rid_server.pop(rid, None)

    async def start_from(self, source: WeightSource, version: int) -> None:
        """Every server serves ``source`` as ``version``, whatever it served before: a run's first
        weights (after SFT, or a resumed checkpoint's), before any rollout. Servers that already
        serve that folder at that version (launched by the run from it) are not reloaded."""
        if not await self.serves(source, version):
            await self.pause()
            try:
                await self.update_weights(source, version, reset=True)
            finally:
                await self.resume()
        self._version = version

    async def serves(self, source: WeightSource, version: int) -> bool:
        """Whether every server already serves ``source`` at ``version`` (unknown here: no)."""
        return False

    async def update_weights(
        self, source: WeightSource, version: int, *, reset: bool = False
    ) -> None:
        raise NotImplementedError

    async def pause(self) -> None:
        raise NotImplementedError

    async def resume(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ HTTP

    async def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            # A session belongs to one event loop; tests and scripts may use several in turn.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=0),  # concurrency is the caller's choice
            )
            self._session_loop = loop
        return self._session

    async def request(self, method: str, url: str, payload: dict | None = None) -> Any:
        """JSON request with retries (exponential backoff) on connection errors and timeouts."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential(multiplier=self.retry_backoff_s, max=30),
            retry=retry_if_exception(_retryable),
            reraise=True,
        ):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    logger.warning(
                        "retrying %s %s (attempt %d)",
                        method,
                        url,
                        attempt.retry_state.attempt_number,
                    )
                session = await self._get_session()
                async with session.request(method, url, json=payload) as resp:
                    if resp.status >= 400:
                        raise ServerError(url, resp.status, await resp.text())
                    if resp.content_length == 0:
                        return None
                    return await resp.json(content_type=None)
        raise AssertionError("unreachable")  # AsyncRetrying either returns or reraises

    async def post_all(self, path: str, payload: dict | None = None) -> list[Any]:
        """POST to every live server at once; raises the first failure after all have answered.
        A server found unreachable is marked down and left out (a restarted one is brought to
        the current weights before it is restored)."""
        live = [i for i in range(len(self.urls)) if i not in self._down]
        results = await asyncio.gather(
            *(self.request("POST", self.urls[i] + path, payload) for i in live),
            return_exceptions=True,
        )
        answers = []
        for i, result in zip(live, results, strict=True):
            if isinstance(result, BaseException) and unreachable(result):
                self.mark_down(i, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        if not answers:
            raise ServersDown(f"no inference server answered {path}: {self.urls}")
        return answers

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _remember(routes: OrderedDict, key: Any, index: int, limit: int) -> None:
    """Route ``key`` to ``index``, most recent last; the oldest route goes past ``limit``."""
    routes[key] = index
    routes.move_to_end(key)
    if len(routes) > limit:
        routes.popitem(last=False)
