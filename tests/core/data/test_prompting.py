"""One prompt path for SFT, rollout and eval: template and chat formats, stop tokens, targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import ConfigError, load_config
from core.data import Prompter
from core.models import create_pretrained, load_tokenizer
from tests.chat_model import IM_END, build_chat_model

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
CORPUS = ["Question: what is 2+3?\nAnswer: 2+3=5 #### 5"] * 20


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(build_chat_model(tmp_path_factory.mktemp("chat"), CORPUS))


@pytest.fixture(scope="module")
def plain_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("plain")
    return load_tokenizer(create_pretrained("tiny", CORPUS, directory, vocab_size=400, seed=1))


def test_chat_prompt_is_the_templates_text_with_its_own_special_tokens(chat_tokenizer) -> None:
    prompter = Prompter(chat_tokenizer, "chat", "gsm8k_cot", system_prompt="Be brief.")
    ids = prompter.prompt_ids("what is 2+3?")
    text = chat_tokenizer.decode(ids)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nwhat is 2+3? Let's think "
        'step by step and output the final answer after "####".<|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    im_start, im_end = chat_tokenizer.convert_tokens_to_ids(["<|im_start|>", IM_END])
    assert ids[0] == im_start and ids.count(im_start) == 3  # one token each, none added twice
    assert chat_tokenizer.bos_token_id not in ids  # this template writes no BOS
    # generation stops at the end of the turn first, then at EOS; SFT targets end the turn
    assert prompter.stop_ids == [im_end, chat_tokenizer.eos_token_id]
    assert prompter.target_ids("5 #### 5")[-1] == im_end
    # no system prompt: the template's default one
    default = chat_tokenizer.decode(Prompter(chat_tokenizer, "chat", "plain").prompt_ids("Q"))
    assert default.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")


def test_template_format_keeps_the_tiny_models_prompt(plain_tokenizer) -> None:
    prompter = Prompter(plain_tokenizer, "template", "plain")
    ids = prompter.prompt_ids("what is 2+3?")
    # exactly the text, no special tokens: this tokenizer defines none to add
    assert (
        ids
        == plain_tokenizer("Question: what is 2+3?\nAnswer: ", add_special_tokens=False)[
            "input_ids"
        ]
    )
    assert prompter.stop_ids == [plain_tokenizer.eos_token_id]
    assert prompter.target_ids("5")[-1] == plain_tokenizer.eos_token_id
    custom = Prompter(plain_tokenizer, "template", "Q: {question} A:").prompt_ids("hi")
    assert plain_tokenizer.decode(custom) == "Q: hi A:"


def test_chat_format_needs_a_chat_template(plain_tokenizer) -> None:
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        Prompter(plain_tokenizer, "chat", "plain")


def test_a_template_typo_fails_at_config_time_naming_the_placeholder(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text('data:\n  template: "Q: {qestion} A:"\n')
    with pytest.raises(ConfigError, match=r"\['qestion'\].*available: \['\{question\}'\]"):
        load_config(path)
    with pytest.raises(ConfigError, match="data.prompt_format='chatml' is not one of"):
        load_config(QUICKSTART, ["data.prompt_format=chatml"])


@pytest.mark.e2e
def test_a_chat_model_learns_to_end_its_turn_and_rl_runs(tmp_path: Path) -> None:
    """SFT through the chat template, then RL: sampled answers stop at <|im_end|>."""
    import torch

    from core.data import generate_splits
    from core.models import load_model
    from core.runtime.job import run_experiment

    cfg = load_config(QUICKSTART)
    train, _ = generate_splits(cfg.data.synthetic, 200, 10, seed=1)
    corpus = [f"Question: {row['question']}\nAnswer: {row['answer']}" for row in train]
    model_dir = build_chat_model(tmp_path / "chat-model", corpus)
    summary = run_experiment(
        load_config(
            QUICKSTART,
            [
                f"model.path={model_dir}",
                "data.prompt_format=chat",
                "data.system_prompt=Solve it.",
                f"cluster.fileroot={tmp_path}",
                "experiment.trial=chat",
                "data.n_train=200",
                "data.n_test=4",
                "eval.n_problems=4",
                "sft.steps=60",
                "sft.batch_size=16",
                "sft.warmup_steps=5",
                "learner.total_steps=2",
                "rollout.batch_size=4",
                "algorithm.group_size=2",
                "eval.every_n_steps=0",
                "checkpoint.every_n_steps=0",
            ],
        )  # fmt: skip
    )
    assert summary["steps"] == 2
    tokenizer = load_tokenizer(model_dir)
    prompter = Prompter(tokenizer, "chat", "plain", system_prompt="Solve it.")
    model = load_model(summary["final_model_dir"])
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    ended = 0
    for row in train[:8]:
        prompt = torch.tensor([prompter.prompt_ids(row["question"])])
        out = model.generate(prompt, max_new_tokens=48, do_sample=False, eos_token_id=im_end)
        ended += int(out[0, -1] == im_end)
    assert ended >= 6, ended  # the SFT target ended with <|im_end|>, so answers do too
