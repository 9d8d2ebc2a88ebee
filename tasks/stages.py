"""The experiment's stages as Prefect tasks: the stage runner the experiment flow hands to
:class:`core.runtime.job.Pipeline`, so each stage is one task run (one node of the flow's DAG).

Retries only where re-running is harmless (data preparation, model building); RL is resumable
(``checkpoint.recover=auto``), so a failed run is re-run, not retried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NONE

T = TypeVar("T")

RETRIES: dict[str, int] = {"prepare_data": 2, "build_model": 1}


def prefect_stage(name: str, fn: Callable[..., T], /, *args: Any) -> T:
    """Run ``fn(*args)`` as the Prefect task ``name`` of the current flow run."""
    stage = task(
        fn, name=name, retries=RETRIES.get(name, 0), retry_delay_seconds=2, cache_policy=NONE
    )
    return stage(*args)
