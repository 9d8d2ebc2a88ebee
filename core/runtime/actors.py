"""Run an object in another process and call its methods: Ray actors, or plain subprocesses.

The train loop talks to the rollout worker and to the learner ranks through :class:`Actor`, so
the same loop runs on a Ray cluster (``scheduler.type=ray``) and on a laptop without Ray
(``scheduler.type=local``: one subprocess per actor, method calls over a pipe).

Local actors fork from Python's *forkserver*: a clean process, started once per job, that has
imported the workers' modules (torch, transformers, the model code). A new actor then starts
without importing them again (~4 s on 2 CPU cores, which every run of a sweep paid).
Like a spawned child, it inherits no threads, torch state or open files of the parent; it is
given the parent's environment and working directory as they are when the actor is created.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import threading
import traceback
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger(__name__)

# What the forkserver imports once for every actor: the workers' modules and, through them,
# torch and transformers. (Module-level settings read from the environment, such as
# core.storage's timeouts, are therefore the job's at the forkserver's start.)
FORKSERVER_PRELOAD = ["torch", "core.runtime.rollout_worker", "core.runtime.learner_worker"]


def actor_context() -> Any:
    """The multiprocessing context local actors start from: the forkserver, with
    :data:`FORKSERVER_PRELOAD` imported (its start-up is paid once per process)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


class Actor(Protocol):
    """A remote object: ``call`` blocks, ``call_async`` returns a future; calls run in order."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> cf.Future: ...

    def close(self) -> None: ...


class ActorError(RuntimeError):
    """A method raised inside an actor; the message carries the remote traceback."""


def _serve(
    conn: Any, factory: Callable[..., Any], args: tuple, kwargs: dict, env: dict[str, str], cwd: str
) -> None:
    # The forkserver's environment and folder are the parent's at its start: take today's.
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        obj = factory(*args, **kwargs)
    except BaseException:  # report construction failures to the parent, then exit
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        method, call_args, call_kwargs = message
        try:
            conn.send(("ok", getattr(obj, method)(*call_args, **call_kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    close = getattr(obj, "close", None)
    if callable(close):
        close()


class ProcessActor:
    """``factory(*args, **kwargs)`` built in a subprocess (forked from the forkserver, see the
    module docstring) with this process's environment plus ``env``; calls go over a pipe."""

    def __init__(
        self,
        factory: Callable[..., Any],
        *args: Any,
        env: dict[str, str] | None = None,
        name: str = "actor",
        start_timeout_s: float = 300.0,
        wait: bool = True,
        **kwargs: Any,
    ) -> None:
        ctx = actor_context()
        self._conn, child = ctx.Pipe()
        self.name = name
        environment = {**os.environ, **(env or {})}
        self.process = ctx.Process(
            target=_serve,
            args=(child, factory, args, kwargs, environment, os.getcwd()),
            name=name,
            daemon=True,
        )
        self.process.start()
        child.close()
        self._lock = threading.Lock()
        self._unanswered: str | None = None  # a call sent whose answer was not read yet
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.start_timeout_s = start_timeout_s
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the object is built (ranks of one process group must all start first)."""
        if not self._conn.poll(self.start_timeout_s):
            self.close()
            raise ActorError(f"{self.name} did not start within {self.start_timeout_s} s")
        status, detail = self._conn.recv()
        if status != "ready":
            self.close()
            raise ActorError(f"{self.name} failed to start:\n{detail}")

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if not self.process.is_alive():
                raise ActorError(f"{self.name} (pid {self.process.pid}) is not running")
            if self._unanswered is not None:  # an earlier call's wait was interrupted (a signal)
                logger.info(
                    "%s: waiting for the interrupted %s() first", self.name, self._unanswered
                )
                self._receive(self._unanswered)
            self._conn.send((method, args, kwargs))
            self._unanswered = method
            status, value = self._receive(method)
            self._unanswered = None
        if status == "error":
            raise ActorError(f"{self.name}.{method}() failed:\n{value}")
        return value

    def _receive(self, method: str) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except EOFError:
            raise ActorError(f"{self.name} died during {method}()") from None

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        return self._pool.submit(self.call, method, *args, **kwargs)

    def close(self, timeout_s: float = 30.0) -> None:
        if self.process.is_alive():
            if self._lock.acquire(timeout=1.0):  # no call in flight: ask the object to stop
                try:
                    self._conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
                finally:
                    self._lock.release()
            else:  # a call still runs (one a watchdog gave up on): it would not read the request
                logger.warning("%s is busy with %s(): terminating it", self.name, self._unanswered)
                self.process.terminate()
                timeout_s = min(timeout_s, 10.0)
            self.process.join(timeout_s)
        if self.process.is_alive():
            logger.warning(
                "%s did not stop in %.0f s; killing pid %s", self.name, timeout_s, self.process.pid
            )
            self.process.kill()
            self.process.join(5)
        self._pool.shutdown(wait=False)


class InProcessActor:
    """The object in this process; ``call_async`` runs on one worker thread (calls stay ordered)."""

    def __init__(
        self, factory: Callable[..., Any], *args: Any, name: str = "actor", **kwargs: Any
    ) -> None:
        self.obj = factory(*args, **kwargs)
        self.name = name
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._last: cf.Future | None = None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.obj, method)(*args, **kwargs)

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        self._last = self._pool.submit(self.call, method, *args, **kwargs)
        return self._last

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._last is not None and self._last.running():
            # a call a watchdog gave up on: a thread cannot be stopped; leave the object to it
            logger.warning("%s: a call is still running; not closing the object", self.name)
            return
        self._pool.shutdown(wait=True)
        close = getattr(self.obj, "close", None)
        if callable(close):
            close()


class RayActor:
    """A Ray actor wrapped in the same interface (Ray must be initialised by the caller)."""

    def __init__(
        self,
        factory: type,
        *args: Any,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        env: dict[str, str] | None = None,
        name: str = "actor",
        scheduling_strategy: Any = None,
        **kwargs: Any,
    ) -> None:
        import ray

        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "name": None}
        if scheduling_strategy is not None:  # e.g. a placement group's bundle
            options["scheduling_strategy"] = scheduling_strategy
        if env:
            options["runtime_env"] = {"env_vars": env}
        self.name = name
        self.handle = ray.remote(factory).options(**options).remote(*args, **kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call_async(method, *args, **kwargs).result()

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> cf.Future:
        return getattr(self.handle, method).remote(*args, **kwargs).future()

    def close(self) -> None:
        import ray

        try:
            ray.get(self.handle.close.remote(), timeout=30)
        except Exception as err:  # the actor may already be gone; killing it is what matters
            logger.debug("%s close(): %r", self.name, err)
        ray.kill(self.handle)
