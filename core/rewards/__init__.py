"""Reward functions for RL on LLM completions, and the registry that resolves them by path."""

from core.rewards.gsm8k import extract_answer, gsm8k_reward, is_direct_answer, parse_number
from core.rewards.registry import RewardFn, SafeReward, resolve_reward

__all__ = [
    "RewardFn",
    "SafeReward",
    "extract_answer",
    "gsm8k_reward",
    "is_direct_answer",
    "parse_number",
    "resolve_reward",
]
