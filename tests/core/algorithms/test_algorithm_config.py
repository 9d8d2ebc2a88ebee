"""AlgorithmConfig validation, presets and OmegaConf compatibility."""

import dataclasses
import re
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from core.algorithms import PRESET_NOTES, PRESETS, AlgorithmConfig, algorithm_config
from core.algorithms.config import preset_names

pytestmark = pytest.mark.unit


def test_every_field_has_help_and_a_structured_config_type():
    allowed = {str, int, float, bool, str | None, int | None, float | None, bool | None}
    hints = typing.get_type_hints(AlgorithmConfig)
    for f in dataclasses.fields(AlgorithmConfig):
        assert f.metadata.get("help"), f.name
        assert hints[f.name] in allowed, f.name
    conf = OmegaConf.structured(AlgorithmConfig)
    assert conf.adv_estimator == "grpo"
    cfg = OmegaConf.to_object(OmegaConf.merge(conf, {"eps_clip": 0.1}))
    assert isinstance(cfg, AlgorithmConfig) and cfg.eps_clip == 0.1


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_and_are_documented(name):
    cfg = algorithm_config(name)
    assert cfg.name == name
    for key, value in PRESETS[name].items():
        assert getattr(cfg, key) == value
    assert "Does NOT" in PRESET_NOTES[name]
    OmegaConf.structured(cfg)


def test_preset_contents():
    assert set(preset_names()) == {
        "grpo", "ppo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "cispo"
    }  # fmt: skip
    dapo = algorithm_config("dapo")
    assert (dapo.eps_clip, dapo.eps_clip_high) == (0.2, 0.28)
    assert dapo.dynamic_sampling and dapo.overlong_reward_penalty and dapo.kl_coef == 0.0
    assert dapo.loss_aggregation == "token-mean"
    dr = algorithm_config("dr_grpo")
    assert not dr.normalize_std and dr.loss_aggregation == "seq-mean-token-sum-norm"
    ppo = algorithm_config("ppo")
    assert ppo.use_critic and ppo.adv_estimator == "gae"
    gspo = algorithm_config("gspo")
    assert gspo.importance_level == "sequence" and gspo.eps_clip == 3e-4
    assert gspo.eps_clip_high == 4e-4
    cispo = algorithm_config("cispo")
    assert cispo.policy_loss == "cispo" and cispo.eps_clip_high == 0.28 and cispo.kl_coef == 0


def test_overrides_and_unknown_names():
    cfg = algorithm_config("grpo", group_size=4, eps_clip_high=0.3)
    assert cfg.group_size == 4 and cfg.eps_clip_high == 0.3
    with pytest.raises(ValueError, match="valid: .*grpo"):
        algorithm_config("trpo")
    with pytest.raises(ValueError, match="epsilon"):
        algorithm_config("grpo", epsilon=0.1)


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"adv_estimator": "vtrace"}, "adv_estimator"),
        ({"eps_clip": -0.1}, "eps_clip"),
        ({"eps_clip_high": -0.1}, "eps_clip_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"adv_estimator": "gae"}, "use_critic"),
        ({"use_critic": True}, "use_critic"),
        ({"group_size": 1}, "group_size"),
        ({"importance_level": "seq"}, "importance_level"),
        ({"behaviour_mask_mode": "drop"}, "behaviour_mask_mode"),
        ({"behaviour_cap": 0.0}, "behaviour_cap"),
        ({"loss_aggregation": "mean"}, "loss_aggregation"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"kl_estimator": "k1", "kl_coef": 0.1}, "kl_estimator='k1' with kl_coef > 0"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"gamma": 1.5}, "gamma"),
        ({"lr": -1e-3}, "lr"),
        ({"decoupled": False, "use_loglinear_proximal": True}, "use_loglinear_proximal"),
        ({"overlong_max_len": 100, "overlong_buffer_len": 200}, "overlong_buffer_len"),
        ({"ppo_n_minibatches": 0}, "ppo_n_minibatches"),
    ],
)
def test_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        AlgorithmConfig(**overrides)


def test_docs_tables_match_presets():
    """docs/algorithms.md lists each preset's knobs; keep it in sync with PRESETS."""
    text = (Path(__file__).parents[3] / "docs" / "algorithms.md").read_text()
    documented, current = {}, None
    for line in text.splitlines():
        heading = re.match(r"### `(\w+)`", line)
        if heading:
            current = documented.setdefault(heading.group(1), {})
        row = re.match(r"\| `(\w+)` \| `([^`]*)` \|$", line)
        if row and current is not None:
            current[row.group(1)] = row.group(2)
    assert documented == {
        name: {k: str(v) for k, v in preset.items()} for name, preset in PRESETS.items()
    }
