"""What the HTTP engine clients share: server choice, retries, pause state, the weight version.

Routing: a new request goes to the next server round-robin; a resumed request (same ``rid``, see
:func:`~core.inference.api.generate_resuming`) goes back to the server that started it, whose
prefix cache may still help and whose ``rid`` bookkeeping stays in one place.

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
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

logger = logging.getLogger(__name__)

_RETRY_STATUS = {502, 503, 504}  # a server restarting or a proxy in front of one
API_KEY_ENV = "ASYNCRL_ENGINE_API_KEY"


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

    def server_for(self, rid: str) -> int:
        """The server index for ``rid``: sticky once chosen, round-robin for new ones."""
        if rid not in self._rid_server:
            self._rid_server[rid] = next(self._round_robin)
        return self._rid_server[rid]

    def release(self, rid: str) -> None:
        """Forget ``rid`` once its request finished for good (not aborted)."""
        self._rid_server.pop(rid, None)

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
        """POST to every server at once; raises the first failure after all have answered."""
        results = await asyncio.gather(
            *(self.request("POST", url + path, payload) for url in self.urls),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return results

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
