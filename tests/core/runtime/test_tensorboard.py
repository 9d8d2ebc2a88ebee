"""The TensorBoard sink: what it writes, read back with TensorBoard's own reader."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

from core.config import load_config
from core.runtime.job import Pipeline
from core.runtime.metrics import finite_numbers
from core.runtime.tensorboard import TensorBoardSink, tensorboard_dir
from tests.core.runtime.helpers import read_scalars

pytestmark = pytest.mark.unit

QUICKSTART = Path(__file__).resolve().parents[3] / "experiments" / "quickstart.yaml"


def f32(value: float) -> float:
    """What a TensorBoard scalar holds of ``value`` (it stores float32)."""
    return float(np.float32(value))


def test_scalars_read_back_with_their_keys_steps_and_values(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    rows = [
        ({"sft/loss": 2.5 - 0.1 * step, "sft/lr": 1e-5, "sft/grad_norm": math.nan}, step)
        for step in range(3)
    ]
    rows.append(({"reward/mean": 0.25, "staleness/max": 4, "eval/accuracy": math.inf}, 0))
    rows.append(({"reward/mean": 0.75, "staleness/max": 3, "eval/accuracy": 0.5}, 1))
    for metrics, step in rows:
        sink.log_metrics(metrics, step)
    # readable before close: every row is flushed
    got = read_scalars(tmp_path / "tb")
    sink.close()
    assert got == read_scalars(tmp_path / "tb")
    assert got == {
        "sft/loss": [(0, f32(2.5)), (1, f32(2.4)), (2, f32(2.3))],
        "sft/lr": [(0, f32(1e-5)), (1, f32(1e-5)), (2, f32(1e-5))],
        "reward/mean": [(0, 0.25), (1, 0.75)],
        "staleness/max": [(0, 4.0), (1, 3.0)],
        "eval/accuracy": [(1, 0.5)],  # inf at step 0 dropped, as MLflow's sink drops it
    }
    assert "sft/grad_norm" not in got  # NaN at every step: never written


def test_drops_what_mlflow_drops(tmp_path: Path) -> None:
    row = {"ok": 1.5, "int": 7, "nan": math.nan, "inf": -math.inf, "none": None,
           "flag": True, "text": "x", "array": np.float32(0.5)}  # fmt: skip
    sink = TensorBoardSink(tmp_path)
    sink.log_metrics(row, 3)  # type: ignore[arg-type]
    sink.close()
    assert finite_numbers(row) == {"ok": 1.5, "int": 7.0}  # the rule MLflowSink applies
    assert read_scalars(tmp_path) == {"ok": [(3, 1.5)], "int": [(3, 7.0)]}


def test_no_file_until_a_number_and_a_new_file_after_close(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    sink.log_metrics({"nan": math.nan}, 0)
    sink.close()
    assert not (tmp_path / "tb").exists()
    sink.log_metrics({"x": 1.0}, 0)
    sink.close()
    sink.log_metrics({"x": 2.0}, 1)  # e.g. a resumed run: a second event file, same folder
    sink.close()
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    assert read_scalars(tmp_path / "tb") == {"x": [(0, 1.0), (1, 2.0)]}


def test_rows_from_several_threads_all_land(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path)

    def log(key: str) -> None:
        for step in range(50):
            sink.log_metrics({key: float(step)}, step)

    threads = [threading.Thread(target=log, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.close()
    got = read_scalars(tmp_path)
    assert got == {f"t{i}": [(s, float(s)) for s in range(50)] for i in range(4)}


def test_pipeline_writes_under_the_run_folder_and_closes_on_failure(tmp_path: Path) -> None:
    cfg = load_config(QUICKSTART, [f"cluster.fileroot={tmp_path}", "experiment.trial=tb"])
    assert tensorboard_dir(cfg) == tmp_path / "quickstart" / "tb" / "tensorboard"

    def failing_stage(name: str, fn, /, *args):  # logs like SFT would, then fails
        pipeline.sink.log_metrics({"sft/loss": 1.25, "sft/lr": math.nan}, 0)
        raise RuntimeError(f"{name} failed")

    pipeline = Pipeline(cfg, run_stage=failing_stage)
    with pytest.raises(RuntimeError, match="prepare_data failed"):
        pipeline.run()
    assert pipeline.tensorboard is not None and pipeline.tensorboard._writer is None  # closed
    assert read_scalars(tensorboard_dir(cfg)) == {"sft/loss": [(0, 1.25)]}
    jsonl = (tmp_path / "quickstart" / "tb" / "metrics.jsonl").read_text()
    assert jsonl == '{"step": 0, "sft/loss": 1.25, "sft/lr": null}\n'


def test_tracking_tensorboard_false_writes_none(tmp_path: Path) -> None:
    cfg = load_config(
        QUICKSTART,
        [f"cluster.fileroot={tmp_path}", "experiment.trial=no-tb", "tracking.tensorboard=false"],
    )
    pipeline = Pipeline(cfg)
    pipeline.sink.log_metrics({"sft/loss": 1.0}, 0)
    pipeline.close()
    assert pipeline.tensorboard is None
    assert not tensorboard_dir(cfg).exists()
    assert (tmp_path / "quickstart" / "no-tb" / "metrics.jsonl").exists()
