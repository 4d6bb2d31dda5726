"""The decoder-only language model: cached decoding equals the full pass for every scheme, no cross-attention."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import model, predict
from rpr.attention import positions
from tests.test_train import ConfigError, validate, train_run

# Programs compiled as one LLVM module (see tests/attention/test_chunked.py).

# 10 tokens reach the clipped ranges
POS = {"shaw": {"max_distance": 2}, "t5": {"num_buckets": 4, "horizon": 8}}
NO_INPUTS = jnp.zeros((2, 0), jnp.int32)
TEXT = jnp.array([[5, 6, 9, 3, 7, 8, 4, 4, 10, 11], [3, 12, 11, 12, 13, 5, 6, 0, 0, 0]], jnp.int32)


def tiny(**kw):
  kw = {"num_encoder_layers": 0, "num_decoder_layers": 1, **kw}
  kw.setdefault("position_options", POS.get(kw.get("position", "shaw")))
  return model.preset("tiny", deterministic=True, max_length=16, **kw)


def perturbed_params(config, seed=0):
  """Random parameters of the right shapes (position tables far from their near-zero init)."""
  shapes = jax.eval_shape(lambda: model.build(config).init(jax.random.PRNGKey(0), NO_INPUTS, TEXT))["params"]
  rng = np.random.default_rng(seed)

  def draw(path, x):
    noise = rng.normal(size=x.shape) * 0.5 / np.sqrt(x.shape[0] if x.ndim > 1 else 1)
    return jnp.asarray(noise + (jax.tree_util.keystr(path).endswith("['scale']")), jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def cached_logits(config, params, text):
  """One token at a time from an init-sized cache, as tests/test_model.py runs the encoder-decoder."""
  from tests import test_model

  return test_model.cached_logits(config, params, NO_INPUTS, text)


def test_build_picks_the_decoder_only_model_without_encoder_layers():
  assert isinstance(model.build(tiny()), model.LanguageModel)
  assert isinstance(model.build(tiny(num_encoder_layers=1)), model.Transformer)
  params = perturbed_params(tiny(position="shaw", num_decoder_layers=2))
  assert set(params) == {"embedding", "decoder"}
  layer = params["decoder"]["layer_0"]
  assert "self_attention" in layer and not any("cross" in name for name in layer)


@pytest.mark.parametrize("scheme", sorted(positions.SCHEMES))
def test_cached_decoding_equals_full_pass(scheme):
  # Two layers for t5, whose one bias table serves every layer of the stack.
  config = tiny(position=scheme, num_decoder_layers=2 if scheme == "t5" else 1)
  params = perturbed_params(config)
  dense, chunked = model.build(config), model.build(config.replace(attention_implementation="chunked"))
  full, chunked = jax.jit(lambda p: (dense.apply(p, NO_INPUTS, TEXT), chunked.apply(p, NO_INPUTS, TEXT)))(
      {"params": params})  # one compilation for both passes
  step = cached_logits(config, params, TEXT)
  assert full.shape == (2, 10, config.vocab_size)
  valid = (TEXT != 0)[..., None]  # after the PAD tail the two passes see different (masked) inputs
  np.testing.assert_allclose(np.where(valid, step, 0), np.where(valid, full, 0), atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(chunked, full, atol=2e-5, rtol=2e-5)


def test_the_model_is_causal():
  config = tiny(position="shaw")
  params = perturbed_params(config)
  f = jax.jit(model.build(config).apply)
  changed = TEXT.at[:, 6:].set(13)
  a, b = f({"params": params}, NO_INPUTS, TEXT), f({"params": params}, NO_INPUTS, changed)
  np.testing.assert_array_equal(a[:, :7], b[:, :7])  # logits at t see BOS and text[:t] only
  assert not np.allclose(a[:, 7:], b[:, 7:])


def test_greedy_generation_continues_the_full_pass_argmax():
  config = tiny(position="rope")
  params = perturbed_params(config)
  # Jitted, not op by op: one compilation for the decoding, one per prefix length for the full pass.
  out = jax.jit(lambda p: predict.predict(p, NO_INPUTS, model_config=config, max_decode_len=6))(params)
  f = jax.jit(model.build(config).apply)
  for row in np.asarray(out):
    prefix = []
    for token in row:
      if token == 0:
        break
      logits = f({"params": params}, NO_INPUTS[:1], jnp.asarray([prefix + [0]], jnp.int32))[0, len(prefix)]
      logits = logits.at[:2].set(-jnp.inf)  # PAD and BOS are never written
      assert int(jnp.argmax(logits)) == int(token)
      prefix.append(int(token))
      if token == 2:
        break


def test_inputs_are_refused():
  config = tiny()
  with pytest.raises(ValueError, match="takes no inputs, got inputs of length 3"):
    model.build(config).init(jax.random.PRNGKey(0), jnp.ones((1, 3), jnp.int32), TEXT)
  with pytest.raises(ValueError, match="num_encoder_layers = 0"):
    model.LanguageModel(tiny(num_encoder_layers=1)).init(jax.random.PRNGKey(0), NO_INPUTS, TEXT)


def test_lm_config_trains_and_scores_perplexity_at_every_length(tmp_path):
  """configs/lm.py:tiny through the engine on a small tarball of our own: per-token perplexity at 1x-8x."""
  from configs import lm
  from rpr import train  # noqa: F401
  from rpr.data import sotu
  from tests.data import test_sotu as test_sotu_data

  for variant in ("", "pe=sinusoidal", "pe=shaw,k=0", "ctx=64,seed=2", "tiny,pe=alibi"):
    config = lm.get_config(variant)
    validate(config, num_devices=1)
    assert config.model.num_encoder_layers == 0 and config.model.max_length == 8 * config.lm_context_length
  with pytest.raises(ValueError, match="k= is Shaw's"):
    lm.get_config("pe=t5,k=4")
  corpus_dir = tmp_path / "corpus"
  corpus_dir.mkdir()
  sha = test_sotu_data.make_tarball(corpus_dir)
  sotu.prepare(str(tmp_path / "tfds"), str(corpus_dir), sha)
  config = lm.get_config("tiny,pe=shaw,k=2")
  config.data_dir, config.corpus_dir, config.lm_context_length = str(tmp_path / "tfds"), str(corpus_dir), 8
  results = train_run(config, str(tmp_path / "run"))
  assert results["step"] == 4
  for split in ("validation", "test", "test_x2", "test_x4", "test_x8"):
    ppl, loss = results[f"{split}/perplexity"], results[f"{split}/loss"]
    assert ppl == pytest.approx(np.exp(loss), rel=1e-6)  # label smoothing 0: the loss is the NLL
    assert 1.0 < ppl < 2 * config.vocab_size and results[f"{split}/tokens"] > 0
    assert f"{split}/exact_match" not in results  # nothing is decoded for a language model
  # An encoder-decoder model on a language-model data set is refused before step 1.
  config.model.num_encoder_layers = 1
  with pytest.raises(ConfigError, match="num_encoder_layers = 1 does not fit data set 'sotu'"):
    train_run(config, str(tmp_path / "other"))
  assert not (tmp_path / "other" / "checkpoints").exists()
