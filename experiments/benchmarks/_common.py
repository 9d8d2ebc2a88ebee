"""What several benchmarks share: one SFT warm start that every compared run starts from."""

from __future__ import annotations

import time

from core.config import Config
from core.runtime.job import Pipeline


def warm_start(cfg: Config, label: str) -> str:
    """Run the pipeline's stages up to and including SFT once; returns the model's HF folder."""
    started = time.perf_counter()
    _, model_dir = Pipeline(cfg).warm_start()
    print(
        f"[{label}] SFT warm start: {time.perf_counter() - started:.0f} s → {model_dir}", flush=True
    )
    return model_dir
