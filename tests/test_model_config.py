"""The model's typed config (rpr.model_config): bad values raise in one line naming them, presets, frozen variants,
and the note on a clipping distance past the longest sequence."""

import dataclasses

import pytest

from rpr import model_config


@pytest.mark.parametrize("overrides, match", [
    (dict(position="relative"), r"position = 'relative'.*allowed: \['alibi'"),
    (dict(cross_position="sinusoidal"), r"cross_position.*allowed"),
    (dict(num_heads=3), r"num_heads = 3.*divisor of d_model = 32"),
    (dict(position_options={"max_distance": -1}), r"max_distance.*>= 0"),
    (dict(position_options={"max_distanse": 4}), r"model.position_options: shaw has no option 'max_distanse'"),
    (dict(position="t5", position_options={"max_distance": 4}), r"t5 has no option 'max_distance'"),
    (dict(dropout_rate=1.5), r"dropout_rate = 1.5 .*>= 0.0 and < 1.0"),
    (dict(num_decoder_layers=0), r"num_decoder_layers = 0.*>= 1"),
    (dict(d_model=30, num_heads=10, position="rope"), r"rope.*even head_dim"),
    (dict(dtype="int32"), r"dtype"),
    (dict(vocab_size=2), r"vocab_size.*PAD, BOS, EOS"),
    (dict(d_modle=64), r"unknown ModelConfig key.*d_modle.*allowed"),
    (dict(attention_implementation="flash"), r"attention_implementation = 'flash'.*\['chunked', 'dense'\]"),
])
def test_bad_configs_raise_clearly(overrides, match):
  with pytest.raises(ValueError, match=match):
    model_config.preset("tiny", **overrides)


def test_unknown_preset_lists_names():
  with pytest.raises(ValueError, match=r"unknown model preset 'small'.*\['tiny', 'base', 'big'\]"):
    model_config.preset("small")


def test_config_is_frozen_and_variants_derive():
  c = model_config.preset("tiny")
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.d_model = 64
  d = c.replace(decode=True, deterministic=True)
  assert d.decode and d.deterministic and not c.decode and hash(d) != hash(c)
  assert c.to_dict()["position_options"]["max_distance"] == 8
