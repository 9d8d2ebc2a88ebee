"""What several benchmarks share: one SFT warm start that every compared run starts from."""

from __future__ import annotations

import time
from pathlib import Path

from core.config import Config
from core.runtime.metrics import MemorySink
from core.runtime.sft import sft_warm_start
from core.runtime.stages import PreparedData, build_or_load_model, prepare_data


def warm_start(cfg: Config, label: str) -> tuple[PreparedData, Path]:
    """Prepare ``cfg``'s data and run its SFT stage once; returns the data and the HF folder."""
    data = prepare_data(cfg)
    started = time.perf_counter()
    model_dir = sft_warm_start(cfg, build_or_load_model(cfg, data), data.train, MemorySink())
    print(
        f"[{label}] SFT warm start: {time.perf_counter() - started:.0f} s → {model_dir}", flush=True
    )
    return data, Path(model_dir)
