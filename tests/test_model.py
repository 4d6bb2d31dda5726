"""Transformer (rpr.model, built from rpr.blocks): cached decoding equals the full pass, masks, parameter counts
(the config's own checks: tests/test_model_config.py)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import decode, model, predict
from rpr.attention import positions
from rpr.tokens import EOS, PAD

# Programs compiled as one LLVM module (see tests/attention/test_chunked.py).

# Small distances so that 6-token sequences reach the clipped and bucketed ranges.
POS = {"shaw": {"max_distance": 2}, "t5": {"num_buckets": 4, "horizon": 8}}
INPUTS = jnp.array([[5, 6, 7, 8, 9, 0, 0], [4, 4, 3, 0, 0, 0, 0]], jnp.int32)
TARGETS = jnp.array([[5, 6, 9, 3, 7, 2], [3, 12, 11, 12, 13, 2]], jnp.int32)


def tiny(**kw):
  """The tiny preset with one layer per stack (compile time) unless ``kw`` says otherwise."""
  kw = {"num_encoder_layers": 1, "num_decoder_layers": 1, **kw}
  kw.setdefault("position_options", POS.get(kw.get("position", "shaw")))
  return model.preset("tiny", deterministic=True, max_length=16, **kw)


def init_shapes(config, inputs=jnp.ones((1, 4), jnp.int32), targets=jnp.ones((1, 4), jnp.int32)):
  m = model.Transformer(config)
  return jax.eval_shape(lambda: m.init(jax.random.PRNGKey(0), inputs, targets))["params"]


def forward(config):
  # Jitted: one compilation costs less than dispatching (and compiling) every op eagerly.
  return jax.jit(model.Transformer(config).apply)


def perturbed_params(config, seed=0):
  """Random parameters of the right shapes, drawn in numpy.

  Position tables are initialised near zero and would hide a wrong offset, so
  every leaf gets noise of scale ``0.5 / sqrt(rows)`` (LayerNorm scales around
  one). Shapes come from ``eval_shape``: running flax's initialisers op by op
  takes seconds on a CPU.
  """
  shapes = init_shapes(config, INPUTS, TARGETS)
  rng = np.random.default_rng(seed)

  def draw(path, x):
    noise = rng.normal(size=x.shape) * 0.5 / np.sqrt(x.shape[0] if x.ndim > 1 else 1)
    return jnp.asarray(noise + (jax.tree_util.keystr(path).endswith("['scale']")), jnp.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def default():
  """``tiny()`` (Shaw's scheme), its perturbed parameters and its jitted forward pass, made once for the tests of the
  default model (a compilation per input shape, shared by them)."""
  config = tiny()
  return config, perturbed_params(config), forward(config)


def cached_logits(config, params, inputs, targets):
  """Runs the decoder one token at a time from an init-sized cache; ``[b, L_out, vocab]``."""
  m = model.build(config.replace(decode=True))  # the language model too: its encode gives None
  cache = model.init_cache(config, inputs.shape[0], targets.shape[1])

  @jax.jit
  def step(cache, ids):
    encoded = m.apply({"params": params}, inputs, method="encode")  # in each step: one compilation, not two
    logits, v = m.apply({"params": params, "cache": cache}, encoded, inputs, ids, method="decode", mutable=["cache"])
    return v["cache"], logits

  decoder_inputs = model.shift_right(targets)
  out = []
  for t in range(targets.shape[1]):
    cache, logits = step(cache, decoder_inputs[:, t:t + 1])
    out.append(logits)
  return jnp.concatenate(out, axis=1)


def test_every_scheme_is_tested():
  assert set(CACHE_CASES) == set(positions.SCHEMES)


# scheme -> cross-attention scheme tested with it (relative ones also in the
# encoder-decoder attention, whose query position a decode step must supply).
CACHE_CASES = {name: (name if name in model.cross_schemes() else "none") for name in positions.SCHEMES}


@pytest.mark.parametrize("scheme", sorted(positions.SCHEMES))
def test_cached_decoding_equals_full_pass(scheme):
  # Two decoder layers for t5: its one bias table serves both from the stack's scheme module.
  layers = 2 if scheme == "t5" else 1
  config = tiny(position=scheme, cross_position=CACHE_CASES[scheme],
                num_decoder_layers=layers)
  params = perturbed_params(config)
  full = forward(config)({"params": params}, INPUTS, TARGETS)
  step = cached_logits(config, params, INPUTS, TARGETS)
  assert full.shape == (2, 6, config.vocab_size)
  np.testing.assert_allclose(step, full, atol=2e-5, rtol=2e-5)


def test_shaw_with_sinusoids_decodes_as_its_full_pass_and_differs_from_shaw_alone(default):
  shaw, _, shaw_forward = default
  assert shaw.position == "shaw"
  config = shaw.replace(position_options={**POS["shaw"], "add_sinusoidal": True})
  params = perturbed_params(config)
  # No parameter of its own: Shaw alone runs on the same parameters.
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(init_shapes(shaw))
  full = forward(config)({"params": params}, INPUTS, TARGETS)
  np.testing.assert_allclose(cached_logits(config, params, INPUTS, TARGETS), full, atol=2e-5, rtol=2e-5)
  alone = shaw_forward({"params": params}, INPUTS, TARGETS)
  assert float(jnp.max(jnp.abs(full - alone))) > 1e-2


def test_cached_decoding_pre_layer_norm_separate_embeddings():
  config = tiny(pre_layer_norm=True, share_embeddings=False, num_encoder_layers=2, num_decoder_layers=2)
  params = perturbed_params(config)
  assert "final_norm" in params["encoder"] and "final_norm" in params["decoder"]
  assert {"source_embedding", "target_embedding"} <= set(params) and "logits" in params["decoder"]
  full = forward(config)({"params": params}, INPUTS, TARGETS)
  np.testing.assert_allclose(cached_logits(config, params, INPUTS, TARGETS), full, atol=2e-5, rtol=2e-5)


def test_post_layer_norm_trains_with_dropout(default):
  shaw, params, apply = default  # the same shapes without dropout: the same parameters
  config = shaw.replace(deterministic=False)
  assert "final_norm" not in params["encoder"] and "final_norm" not in params["decoder"]
  train = jax.jit(lambda p, rng: model.Transformer(config).apply({"params": p}, INPUTS, TARGETS, rngs={"dropout": rng}))
  a, b = train(params, jax.random.PRNGKey(1)), train(params, jax.random.PRNGKey(2))
  c = apply({"params": params}, INPUTS, TARGETS)
  assert np.all(np.isfinite(a)) and not np.allclose(a, b) and not np.allclose(a, c)


# Every scheme meets the chunked kernel in tests/attention/test_chunked.py (layer level); here the switch through the
# whole model, with a relative table (Shaw, also in cross-attention) and with a bias closure (ALiBi).
@pytest.mark.parametrize("scheme", ["shaw", "alibi"])
def test_chunked_attention_implementation_equals_dense(scheme):
  # Same parameters; padded inputs and targets; relative cross-attention where the scheme allows it.
  config = tiny(position=scheme, cross_position=CACHE_CASES[scheme])
  chunked = config.replace(attention_implementation="chunked")
  params = perturbed_params(config)
  targets = TARGETS.at[1, 3:].set(PAD)

  def loss(cfg):  # and the number of values the pass sows: the dense path sows attention weights, chunked forms none
    def f(p):
      logits, state = model.Transformer(cfg).apply({"params": p}, INPUTS, targets, mutable=["intermediates"])
      return jnp.sum(jax.nn.log_softmax(logits) * (targets != PAD)[..., None]), (logits, state)
    (value, (logits, state)), grads = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
    return (value, logits), grads, len(jax.tree_util.tree_leaves(state))

  (dense_loss, dense_logits), dense_grads, dense_sown = loss(config)
  (chunked_loss, chunked_logits), chunked_grads, chunked_sown = loss(chunked)
  assert dense_sown > 0 and chunked_sown == 0  # the switch reaches every attention layer
  real = np.asarray(targets != PAD)
  np.testing.assert_allclose(np.asarray(chunked_logits)[real], np.asarray(dense_logits)[real], atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(chunked_loss, dense_loss, rtol=1e-5)
  chunked_by_path = dict(jax.tree_util.tree_leaves_with_path(chunked_grads))
  for path, g in jax.tree_util.tree_leaves_with_path(dense_grads):
    np.testing.assert_allclose(chunked_by_path[path], g, atol=1e-4, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("scheme", ["shaw", "sinusoidal"])
def test_padding_does_not_leak(scheme):
  # More PAD after the inputs or the targets changes no logit of a real target position.
  config = tiny(position=scheme)
  params = perturbed_params(config)
  apply = forward(config)
  targets = TARGETS.at[1, 3:].set(PAD)
  short = apply({"params": params}, INPUTS[:, :5], targets)
  long = apply({"params": params}, jnp.pad(INPUTS, [(0, 0), (0, 3)]), jnp.pad(targets, [(0, 0), (0, 2)]))
  np.testing.assert_allclose(long[0, :6], short[0], atol=1e-5)
  np.testing.assert_allclose(long[1, :3], short[1, :3], atol=1e-5)


def test_decoder_is_causal(default):
  _, params, apply = default
  a = apply({"params": params}, INPUTS, TARGETS)
  b = apply({"params": params}, INPUTS, TARGETS.at[:, 3].set(7))
  # Target 3 enters the decoder at position 4 (shifted right): positions <= 3 cannot see it.
  np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-6)
  assert not np.allclose(a[:, 4:], b[:, 4:])


def count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def expected_parameters(c: model.ModelConfig) -> int:
  """By hand: no biases in attention projections; Shaw adds a^K and a^V tables per layer."""
  d, f, v, h = c.d_model, c.d_ff, c.vocab_size, c.num_heads
  attention = 4 * d * d  # W^Q, W^K, W^V, W^O
  ffn = d * f + f + f * d + d
  norm = 2 * d
  o = positions.parse_options("shaw", c.position_options if c.position == "shaw" else None)
  rows = 2 * o.max_distance + 1
  shaw = 2 * rows * c.head_dim * (1 if o.share_heads else h)
  enc = attention + ffn + 2 * norm + (shaw if c.position == "shaw" else 0)
  dec = 2 * attention + ffn + 3 * norm + (shaw if c.position == "shaw" else 0)
  emb = v * d if c.share_embeddings else 2 * v * d + d * v + v
  final = 2 * norm if c.pre_layer_norm else 0
  return emb + c.num_encoder_layers * enc + c.num_decoder_layers * dec + final


def test_tiny_parameter_count_is_pinned():
  c = model.preset("tiny")
  # vocab 16, d 32, d_ff 64, 2 heads of 16, k 8 (17 rows), 2 + 2 layers:
  # embedding 16*32 = 512; encoder layer 4096 + 4192 + 128 + 2*2*17*16 = 9504;
  # decoder layer 8192 + 4192 + 192 + 1088 = 13664.
  assert expected_parameters(c) == 512 + 2 * 9504 + 2 * 13664 == 46848
  assert count(init_shapes(c)) == 46848


@pytest.mark.parametrize("name", ["base", "big"])
def test_paper_presets(name):
  c = model.preset(name)
  assert (c.num_encoder_layers, c.num_decoder_layers, c.cross_position) == (6, 6, "none")
  assert c.position == "shaw"
  want = dict(base=(512, 8, 2048, 0.1, 16, False), big=(1024, 16, 4096, 0.3, 8, True))[name]
  pc = c.position_options
  assert (c.d_model, c.num_heads, c.d_ff, c.dropout_rate, pc.max_distance, pc.share_heads) == want
  assert count(init_shapes(c)) == expected_parameters(c)


def test_position_parameters_live_where_the_paper_puts_them():
  shaw = init_shapes(tiny(num_encoder_layers=2))
  assert "position" in shaw["encoder"]["layer_1"]["self_attention"]  # unique per layer
  assert "position" not in shaw["decoder"]["layer_0"]["cross_attention"]  # plain cross-attention
  t5 = init_shapes(tiny(position="t5", num_encoder_layers=2))
  assert t5["encoder"]["position"]["bias"].shape == (POS["t5"]["num_buckets"], 2)  # one table per stack
  assert "position" not in t5["encoder"]["layer_0"]["self_attention"]
  learned = init_shapes(tiny(position="learned"))
  assert learned["decoder"]["position"]["embedding"].shape == (16, 32)  # ModelConfig.max_length rows


def test_attention_weights_are_sown(default):
  config, params, _ = default
  apply = jax.jit(lambda p: model.Transformer(config).apply({"params": p}, INPUTS, TARGETS, mutable=["intermediates"]))
  _, state = apply(params)
  w = state["intermediates"]["encoder"]["layer_0"]["self_attention"]["attention_weights"][0]
  assert w.shape == (2, 2, 7, 7)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
  assert float(w[0, :, :5, 5:].max()) < 1e-6  # no weight on PAD keys
  cross = state["intermediates"]["decoder"]["layer_0"]["cross_attention"]["attention_weights"][0]
  assert cross.shape == (2, 2, 6, 7)


def test_greedy_generation_matches_full_pass_argmax(default):
  # Greedy through the cache equals re-running the whole decoder on each prefix.
  config, params, apply = default
  n = 5
  seqs = jax.jit(lambda p, x: predict.predict(p, x, model_config=config, max_decode_len=n))(params, INPUTS)
  prefix = jnp.zeros((2, n), jnp.int32)
  done = np.zeros(2, bool)
  for t in range(n):
    logits = apply({"params": params}, INPUTS, prefix)[:, t]
    token = np.where(done, PAD, np.argmax(np.asarray(logits), -1))
    prefix = prefix.at[:, t].set(token)
    done |= token == EOS
  np.testing.assert_array_equal(seqs, prefix)


def test_beam_search_scores_match_the_full_pass(default):
  # Every beam's score equals log P / lp recomputed by the teacher-forced model.
  config, params, apply = default
  m = model.Transformer(config.replace(decode=True))
  k, n, alpha = 3, 5, 0.6
  encoded = jax.jit(lambda p: m.apply({"params": p}, INPUTS, method="encode"))(params)  # not op by op
  encoded, inputs = decode.tile_beams(encoded, k), decode.tile_beams(INPUTS, k)

  def tokens_to_logits(ids, cache):
    logits, v = m.apply({"params": params, "cache": cache}, encoded, inputs, ids, method="decode", mutable=["cache"])
    return logits[:, 0], v["cache"]

  search = jax.jit(lambda c: decode.beam_search(tokens_to_logits, c, 2, n, beam_size=k, alpha=alpha, return_all=True))
  seqs, scores = search(model.init_cache(config, 2, n))
  logp = jax.nn.log_softmax(apply({"params": params}, inputs, seqs.reshape(2 * k, n)))
  for row in range(2 * k):
    toks = np.asarray(seqs.reshape(2 * k, n)[row])
    length = int(np.argmax(toks == EOS)) + 1 if EOS in toks else n
    want = float(sum(logp[row, t, toks[t]] for t in range(length))) / ((5 + length) / 6) ** alpha
    assert float(scores.reshape(-1)[row]) == pytest.approx(want, abs=1e-4)
