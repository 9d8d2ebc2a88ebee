"""One TRL ``GRPOTrainer`` run for ``vs_trl``, in a process of its own (its threads, memory and
imports stay out of the benchmark's).

    python -m experiments.benchmarks._trl_grpo --spec spec.json

The spec (written by ``vs_trl``) names the warm start, the prepared train problems, the prompt
template, the reward function and every matched setting; the run writes ``result.json`` and the
trained model (a HF folder) under ``spec["out"]``. Prompts are rendered by our ``Prompter`` and
scored by the task's own reward function, so both trainers see the same tokens and rewards.

Trained samples/s counts the optimizer steps' wall time (TRL's ``on_step_begin`` → ``on_step_end``:
generation, scoring and the update), not model loading or saving; ``vs_trl`` measures ours the
same way (the trainer's step time, evals excluded).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def grpo_config(spec: dict[str, Any], out: Path) -> Any:
    """TRL's settings matched to asyncrl's GRPO (listed in ``vs_trl.MATCHED``)."""
    from trl import GRPOConfig

    batch = spec["prompts_per_step"] * spec["group_size"]
    return GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=spec["steps"],
        per_device_train_batch_size=batch,  # completions per optimizer step
        gradient_accumulation_steps=1,
        steps_per_generation=1,  # one generation batch, one gradient step
        num_iterations=1,
        num_generations=spec["group_size"],
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"],
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        beta=0.0,
        epsilon=spec["eps_clip"],
        loss_type="dapo",  # token mean over the step's batch = loss_aggregation=token-mean
        scale_rewards="group",  # = normalize_std: the group's reward std
        bf16=False,
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        seed=spec["seed"],
        data_seed=spec["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="the JSON spec written by vs_trl")
    spec = json.loads(Path(parser.parse_args().spec).read_text())

    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from core.data.prompting import Prompter
    from core.rewards.registry import resolve_reward
    from core.storage import read_jsonl

    out = Path(spec["out"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    prompter = Prompter(tokenizer, template=spec["template"])
    rows = read_jsonl(spec["train"])
    dataset = Dataset.from_list(
        [{"prompt": prompter.prompt_text(r["question"]), "answer": r["answer"]} for r in rows]
    )
    reward = resolve_reward(spec["reward_fn"])

    def task_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [float(reward(c, a)) for c, a in zip(completions, answer, strict=True)]

    class StepClock(TrainerCallback):
        """Seconds inside optimizer steps (generation + scoring + update), per step."""

        def __init__(self) -> None:
            self.steps: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self._t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.steps.append(time.perf_counter() - self._t0)

    clock = StepClock()
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=task_reward,
        args=grpo_config(spec, out),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    trainer.save_model(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))
    history = [h for h in trainer.state.log_history if "reward" in h]
    step_s = sum(clock.steps)
    samples = len(clock.steps) * spec["prompts_per_step"] * spec["group_size"]
    result = {
        "steps": len(clock.steps),
        "samples": samples,
        "step_s": step_s,
        "train_wall_s": wall,
        "samples_per_s": samples / step_s,
        "step_s_each": clock.steps,
        "reward_mean": [h["reward"] for h in history],
        "completion_length": [h.get("completions/mean_length") for h in history],
        "model_dir": str(out / "model"),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
