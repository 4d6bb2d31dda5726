"""The model's typed config (rpr.model_config): bad values raise in one line naming them, presets, frozen variants,
and the note on a clipping distance past the longest sequence."""

import dataclasses
import logging

import pytest

from rpr import model_config
from rpr.model_config import ModelConfig


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


UNCLIPPED = "Note: Shaw's clipping distance max_distance"


def notes(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.getMessage().startswith(UNCLIPPED)]


def test_a_clipping_distance_past_the_longest_sequence_is_kept_with_one_note_per_validation(caplog):
  """k >= model.max_length clips nothing: the config is kept as given, and each validation says so once."""
  far = ModelConfig(position="shaw", position_options={"max_distance": 64}, max_length=16)
  with caplog.at_level(logging.INFO, logger="absl"):  # absl's level, whatever a test before set it to
    assert far.validate().position_options.max_distance == 64 and len(notes(caplog)) == 1
    far.validate()
  assert notes(caplog) == [
      "Note: Shaw's clipping distance max_distance = 64 (model.shaw; ModelConfig.position_options) is not below the "
      "longest sequence, model.max_length = 16: it clips no distance, so it acts as 15 (max_length - 1), and 98 of "
      "the 129 rows of each relative table are never trained."] * 2


def test_the_note_names_both_attentions_of_one_k_and_is_not_said_where_k_clips_or_has_no_table(caplog):
  shaw = {"max_distance": 16}
  with caplog.at_level(logging.INFO, logger="absl"):  # absl's level, whatever a test before set it to
    ModelConfig(position="shaw", position_options=shaw, cross_position="shaw", cross_position_options=shaw,
                max_length=16).validate()
    assert len(notes(caplog)) == 1
    assert "(model.shaw; ModelConfig.position_options and cross_position_options)" in notes(caplog)[0]
    assert "acts as 15 (max_length - 1), and 2 of the 33 rows" in notes(caplog)[0]
    ModelConfig(position="shaw", position_options={"max_distance": 15}, max_length=16).validate()  # k clips
    ModelConfig(position="shaw", position_options={"max_distance": 64, "use_keys": False, "use_values": False},
                max_length=16).validate()  # no table: k does nothing
    ModelConfig(position="t5", max_length=16).validate()
  assert len(notes(caplog)) == 1
