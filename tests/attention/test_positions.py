"""rpr.attention.positions: what each scheme lets attention see, its options, and the registry's test coverage.

Each behaviour is checked through a small model that uses the scheme like a
Transformer would: ``scheme.embed`` on the token embeddings, then a
MultiHeadAttention self-attention layer with the same scheme inside (``none``
for an absolute scheme, which acts at the embeddings only).
"""

import dataclasses
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import attention as attn
from rpr.attention import positions
from rpr.attention import MultiHeadAttention

# ----------------------------------------------------------------------------
# 7. Registry coverage: every registered scheme must be named here with the
# tests that exercise it, so registering a scheme without tests fails
# test_every_registered_scheme_has_tests. Entries are "file::test function".

_EVERY_SCHEME = (
    "test_positions.py::test_12_plus_1_rows",
    "test_positions.py::test_translation",
    "test_layer.py::test_causal_attention_leaks_nothing",
    "test_layer.py::test_padded_keys_are_ignored",
    "test_layer.py::test_jit_grad_bfloat16",
    "test_layer.py::test_decode_matches_full_causal_pass",
    "test_layer.py::test_a_scheme_name_either_raises_or_makes_the_layer_see_order",
)
COVERAGE = {
    "none": _EVERY_SCHEME + ("test_positions.py::test_no_position_layer_is_permutation_equivariant",),
    "sinusoidal": _EVERY_SCHEME + ("test_positions.py::test_sinusoid_values",),
    "learned": _EVERY_SCHEME + ("test_positions.py::test_learned_rejects_sequences_longer_than_its_table",),
    "shaw": _EVERY_SCHEME + ("test_dense.py::test_shaw_matches_loop_every_term_combination",
                             "test_dense.py::test_shaw_offset_is_translation_invariant",
                             "test_layer.py::test_shaw_layer_matches_reference"),
    "t5": _EVERY_SCHEME + ("test_positions.py::test_t5_buckets",),
    "rope": _EVERY_SCHEME + ("test_positions.py::test_rope_scores_depend_on_distance_only",),
    "alibi": _EVERY_SCHEME + ("test_positions.py::test_alibi_bias",),
    "alibi_directional": _EVERY_SCHEME + (
        "test_positions.py::test_alibi_bias",
        "test_chunked.py::test_bias_and_rotary_schemes_match_dense_with_parameter_gradients"),
}

# The parametrised tests below run over the registry itself, so a newly
# registered scheme runs in them at once (test_parametrised_scheme_lists_are_the_registry);
# test_layer.py keeps its own explicit SCHEMES and checks it against the registry too.
SCHEME_NAMES = sorted(positions.SCHEMES)
RELATIVE = ("shaw", "t5", "rope", "alibi", "alibi_directional")
ABSOLUTE = ("sinusoidal", "learned")


def test_every_registered_scheme_has_tests():
  missing = set(positions.SCHEMES) - set(COVERAGE)
  stale = set(COVERAGE) - set(positions.SCHEMES)
  assert not missing, f"registered position schemes without tests: {sorted(missing)}; add them to COVERAGE"
  assert not stale, f"COVERAGE names schemes that are not registered: {sorted(stale)}"
  assert set(RELATIVE) | set(ABSOLUTE) | {"none"} == set(positions.SCHEMES)
  here = pathlib.Path(__file__).parent
  for scheme, tests in COVERAGE.items():
    for entry in tests:
      file, name = entry.split("::")
      source = (here / file).read_text()
      assert re.search(rf"^def {name}\(", source, re.M), f"{scheme}: {entry} does not exist"


def test_unknown_scheme_name_raises(random_variables):
  with pytest.raises(ValueError, match=r"unknown position scheme 'shaw2'; allowed: \['alibi', .*'t5'\]"):
    positions.make("shaw2", 2, 4)
  layer = MultiHeadAttention(num_heads=2, position="relative")
  with pytest.raises(ValueError, match=r"unknown position scheme 'relative'; allowed: \["):
    random_variables(layer, jnp.ones((1, 3, 8)))


def _parametrised_positions(test):
  (mark,) = [m for m in test.pytestmark if m.name == "parametrize" and m.args[0] == "position"]
  return list(mark.args[1])


def test_parametrised_scheme_lists_are_the_registry():
  # The behaviour tests of this file take their schemes from positions.SCHEMES, not from a list written by
  # hand: every registered scheme runs in them.
  assert SCHEME_NAMES == sorted(positions.SCHEMES)
  for test in (test_12_plus_1_rows, test_translation):
    names = _parametrised_positions(test)
    assert names == sorted(positions.SCHEMES), test.__name__
    missing = set(positions.SCHEMES) - set(names)
    assert not missing, f"{test.__name__} does not run {sorted(missing)}"


# parse_options runs inside make: a bad value fails when the scheme is built, naming it.
@pytest.mark.parametrize("scheme,options,match", [
    ("shaw", dict(max_distance=-3), r"shaw option max_distance = -3 is not allowed; allowed: an int >= 0 and <= 65536"),
    ("t5", dict(num_buckets=1), r"t5 option num_buckets = 1 is not allowed; allowed: an int >= 2"),
    ("t5", dict(num_buckets=32, horizon=8),
     r"t5 option horizon = 8 is not allowed; allowed: an int >= num_buckets \(32\)"),
    ("rope", dict(rope_base=1.0), r"rope option rope_base = 1\.0 is not allowed; allowed: a finite number > 1"),
    ("learned", dict(learned_init_std=0.0), r"learned option learned_init_std = 0\.0 is not allowed"),
    # A name the scheme does not declare, or a value of the wrong type.
    ("alibi", dict(alibi_directional=True), r"alibi has no option 'alibi_directional'; allowed: none"),
    ("shaw", dict(max_distnce=2), r"shaw has no option 'max_distnce'; allowed: \['add_sinusoidal', 'max_distance', "
                                  r"'share_heads', 'use_keys', 'use_values'\]"),
    ("shaw", dict(max_distance=2.5), r"shaw option max_distance = 2\.5 is not allowed; allowed: a int"),
    ("shaw", dict(use_keys=1), r"shaw option use_keys = 1 is not allowed; allowed: a bool"),
    ("shaw", dict(max_distance=True), r"shaw option max_distance = True is not allowed; allowed: a int"),
])
def test_bad_options_raise(scheme, options, match):
  with pytest.raises(ValueError, match=match):
    positions.make(scheme, 2, 4, options=options)


def test_rope_odd_head_dim_raises_in_make():
  with pytest.raises(ValueError, match=r"rope needs an even head_dim, got 3"):
    positions.make("rope", 2, 3)


@pytest.mark.parametrize("std", [0.02, 1.0])
def test_learned_table_starts_at_learned_init_std(std):
  scheme = positions.make("learned", 2, 4, max_length=4096, options=dict(learned_init_std=std))
  x = jnp.zeros((1, 3, 64))
  table = scheme.init(jax.random.PRNGKey(0), x, method="embed")["params"]["embedding"]
  assert table.shape == (4096, 64)
  np.testing.assert_allclose(float(jnp.std(table)), std, rtol=0.02)


def test_each_scheme_declares_its_options_with_their_only_defaults():
  assert positions.defaults("shaw") == dict(max_distance=16, use_keys=True, use_values=True, share_heads=False,
                                            add_sinusoidal=False)
  assert positions.defaults("t5") == dict(num_buckets=32, horizon=128)
  assert positions.defaults("rope") == dict(rope_base=10000.0)
  assert positions.defaults("learned") == dict(learned_init_std=0.02)
  for name in ("none", "sinusoidal", "alibi", "alibi_directional"):
    assert positions.defaults(name) == {}, name
  options = positions.parse_options("rope", dict(rope_base=500))  # an int where a float is expected is fine
  assert isinstance(options, positions.get("rope").Options) and options.rope_base == 500
  shaw = positions.parse_options("shaw", {"max_distance": 4})
  assert positions.parse_options("shaw", shaw) is shaw  # typed options pass through
  assert positions.make("shaw", 2, 4, options=shaw).options == shaw
  assert positions.make("shaw", 2, 4).options == positions.get("shaw").Options()  # None: the defaults


def test_make_gives_each_scheme_its_own_typed_options():
  shaw = positions.make("shaw", 2, 4, options=dict(max_distance=3, share_heads=True))
  o = shaw.options
  assert (o.max_distance, o.share_heads, o.use_keys, o.use_values) == (3, True, True, True)
  t5 = positions.make("t5", 2, 4, causal=True, options=dict(num_buckets=8, horizon=16))
  assert (t5.options.num_buckets, t5.options.horizon, t5.causal, t5.num_heads, t5.head_dim) == (
      8, 16, True, 2, 4)
  assert positions.make("rope", 2, 4, options=dict(rope_base=500.0)).options.rope_base == 500.0
  assert positions.make("learned", 2, 4, max_length=7).max_length == 7
  assert positions.make("t5", 2, 4).options.num_buckets == 32  # no options: the defaults
  with pytest.raises(ValueError, match="alibi has no option 'max_distance'"):  # another scheme's is refused
    positions.make("alibi", 2, 4, options=dict(max_distance=3))


# ----------------------------------------------------------------------------
# The model: token embeddings -> scheme.embed -> self-attention.

F, H = 8, 2
# The options of the schemes that have some; the others take their defaults.
OPTIONS = {"shaw": dict(max_distance=2), "t5": dict(num_buckets=8, horizon=16)}
MAX_LENGTH = 16
VOCAB = "0123456789+-="
# A fixed random character embedding: equal characters get equal vectors.
EMBEDDING = np.random.default_rng(2).normal(size=(len(VOCAB), F)).astype(np.float32)


def embed_chars(text):
  return jnp.asarray(EMBEDDING[[VOCAB.index(c) for c in text]])[None]  # [1, len, F]


class Encoder(nn.Module):
  """``scheme.embed`` (absolute schemes add positions here), then attention with the scheme inside (or none)."""

  position: str

  @nn.compact
  def __call__(self, x, key_valid=None):
    x = positions.make(self.position, H, F // H, max_length=MAX_LENGTH, options=OPTIONS.get(self.position),
                       name="embed_position").embed(x)
    # The layer takes the schemes acting in attention by name; an absolute one has acted above, so it gets 'none'.
    inside = self.position if positions.get(self.position).acts_in_attention() else "none"
    return MultiHeadAttention(num_heads=H, position=inside, position_options=OPTIONS.get(inside),
                              max_length=MAX_LENGTH, name="attention")(x, key_valid=key_valid)


_ENCODERS = {}


def encoder(position, random_variables):
  """(jitted apply returning (out, weights [b, h, q, k]), params), built once per scheme for this module.

  Parameters are N(0, 0.5^2) (conftest), so absolute tables (learned) are as
  visible as a trained one would be rather than near zero as at init.
  """
  if position not in _ENCODERS:
    model = Encoder(position)
    params = random_variables(model, jnp.zeros((1, 4, F)), seed=1)

    @jax.jit
    def apply(params, x, key_valid):
      out, state = model.apply(params, x, key_valid=key_valid, mutable=["intermediates"])
      (weights,) = state["intermediates"]["attention"]["attention_weights"]
      return out, weights

    _ENCODERS[position] = apply, params
  return _ENCODERS[position]


# ----------------------------------------------------------------------------
# 3. "12+1" (seed 002): without positions, equal characters get equal rows.


@pytest.mark.parametrize("position", SCHEME_NAMES)
def test_12_plus_1_rows(random_variables, position):
  apply, params = encoder(position, random_variables)
  _, weights = apply(params, embed_chars("12+1"), None)
  tens, units = np.asarray(weights)[0, :, 0], np.asarray(weights)[0, :, 3]  # [heads, keys]
  gap = np.max(np.abs(tens - units))
  if position == "none":
    # The tens "1" and the units "1" attend identically in every head: nothing
    # tells them apart.
    assert gap < 1e-6, gap
  else:
    assert gap > 1e-3, f"{position}: the two '1's still attend alike (max difference {gap})"


def test_no_position_layer_is_permutation_equivariant(random_variables):
  apply, params = encoder("none", random_variables)
  x = jnp.asarray(np.random.default_rng(3).normal(size=(1, 4, F)), jnp.float32)
  perm = np.random.default_rng(4).permutation(4)
  out, weights = map(np.asarray, apply(params, x, None))
  out_p, weights_p = map(np.asarray, apply(params, x[:, perm], None))
  np.testing.assert_allclose(out_p, out[:, perm], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(weights_p, weights[:, :, perm][:, :, :, perm], rtol=1e-5, atol=1e-6)
  # A relative scheme on the same input is not equivariant (the check can fail).
  apply_shaw, params_shaw = encoder("shaw", random_variables)
  out_s, out_sp = (np.asarray(apply_shaw(params_shaw, y, None)[0]) for y in (x, x[:, perm]))
  assert np.max(np.abs(out_sp - out_s[:, perm])) > 1e-3


# ----------------------------------------------------------------------------
# 4. Translation invariance.


@pytest.mark.parametrize("position", SCHEME_NAMES)
def test_translation(random_variables, position):
  # Batch row 0 holds x at positions 0..3 (3 masked pads after it); row 1
  # holds the same x at positions 3..6 (3 masked pads before it). Queries and
  # keys move together, so every distance j - i is unchanged: relative schemes
  # (and none) must give row 1 exactly what row 0 got; absolute ones must not.
  apply, params = encoder(position, random_variables)
  x = np.asarray(embed_chars("12+1"))[0]
  pad = np.zeros((3, F), np.float32)
  inputs = jnp.asarray(np.stack([np.concatenate([x, pad]), np.concatenate([pad, x])]))
  valid = np.array([[1] * 4 + [0] * 3, [0] * 3 + [1] * 4], bool)
  out, weights = map(np.asarray, apply(params, inputs, jnp.asarray(valid)))
  gap_out = np.max(np.abs(out[0, :4] - out[1, 3:]))
  gap_weights = np.max(np.abs(weights[0, :, :4, :4] - weights[1, :, 3:, 3:]))
  if position in ABSOLUTE:
    assert gap_out > 1e-3 and gap_weights > 1e-3, (gap_out, gap_weights)
  else:
    assert gap_out < 1e-5 and gap_weights < 1e-5, (gap_out, gap_weights)


def test_rope_scores_depend_on_distance_only():
  # q at p and k at p + s: q^T R(p)^T R(p + s) k = q^T R(s) k for every p.
  rng = np.random.default_rng(5)
  q = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)

  @jax.jit
  def score(p, s):
    return jnp.sum(positions.rotate(q, p[None]) * positions.rotate(k, (p + s)[None]))

  for s in (0, 1, 5):
    scores = [float(score(jnp.float32(p), jnp.float32(s))) for p in (0, 3, 17)]
    np.testing.assert_allclose(scores, scores[0], rtol=1e-4, atol=1e-5)
  # ...and does depend on the distance.
  assert abs(float(score(jnp.float32(0), jnp.float32(1))) - float(score(jnp.float32(0), jnp.float32(5)))) > 1e-3
  # Rotations keep norms.
  r = positions.rotate(q, jnp.asarray([7.0]))
  np.testing.assert_allclose(float(jnp.linalg.norm(r)), float(jnp.linalg.norm(q)), rtol=1e-5)


def test_rope_and_sinusoid_keep_float64(x64):
  # Float64 models (and float64 reference checks) must not silently drop to
  # float32 precision (~1e-7 at position 1000) in the position terms.
  rng = np.random.default_rng(6)
  x = rng.normal(size=(1, 3, 1, 4))
  pos = np.arange(3) + 1000
  rotated, table = jax.jit(lambda x, p: (positions.rotate(x, p), positions.sinusoid(p, 4, jnp.float64)))(
      jnp.asarray(x), jnp.asarray(pos))
  assert rotated.dtype == table.dtype == jnp.float64
  angles = pos[:, None] * 10000.0 ** (-np.arange(0, 4, 2) / 4)  # [3, 2]
  x1, x2 = x[0, :, 0, 0::2], x[0, :, 0, 1::2]
  want = np.stack([x1 * np.cos(angles) - x2 * np.sin(angles), x1 * np.sin(angles) + x2 * np.cos(angles)], -1)
  np.testing.assert_allclose(np.asarray(rotated)[0, :, 0], want.reshape(3, 4), rtol=0, atol=1e-12)
  np.testing.assert_allclose(np.asarray(table)[:, 0::2], np.sin(angles), rtol=0, atol=1e-12)
  np.testing.assert_allclose(np.asarray(table)[:, 1::2], np.cos(angles), rtol=0, atol=1e-12)


def test_t5_buckets(random_variables):
  d = np.arange(-20, 21)
  bi, uni = map(np.asarray, jax.jit(lambda r: (positions.t5_bucket(r, True, 8, 16),
                                               positions.t5_bucket(r, False, 8, 16)))(jnp.asarray(d)))
  # Bidirectional: keys left of the query in buckets 0..3, right in 4..7;
  # exact for |d| < 2, then log-spaced, saturating at the last bucket.
  assert bi[d == 0] == 0 and bi[d == -1] == 1 and bi[d == 1] == 5
  assert np.all(bi[d < 0] < 4) and np.all(bi[d > 0] >= 4)
  assert np.all(np.diff(bi[d <= 0][::-1]) >= 0) and bi[d == -20] == 3 and bi[d == 20] == 7
  # Causal: future keys collapse into bucket 0, the past spreads over all 8.
  assert np.all(uni[d >= 0] == 0) and uni[d == -1] == 1 and uni[d == -20] == 7
  # The bias depends on j - i only, and bias() puts query 0 at q_offset.
  t5 = positions.make("t5", H, 4, options=OPTIONS["t5"])
  q = k = jnp.zeros((1, 5, H, 4))
  variables = random_variables(t5, q, k, method=t5.terms)

  @jax.jit
  def biases(variables):
    terms = t5.apply(variables, q, k, 2, method=t5.terms)
    return (terms.bias_fn(jnp.arange(3), jnp.arange(5)), terms.bias_fn(jnp.arange(3) + 7, jnp.arange(5) + 7),
            terms.bias(3, 5, 2)[0], terms.bias_fn(jnp.arange(2, 5), jnp.arange(5)))

  b0, b7, shifted, direct = map(np.asarray, biases(variables))
  np.testing.assert_array_equal(b0, b7)
  np.testing.assert_array_equal(shifted, direct)
  assert np.any(b0 != b0[:, :1, :1])  # not constant, or the checks above prove nothing


def test_alibi_bias():
  np.testing.assert_allclose(positions.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
  assert len(positions.alibi_slopes(6)) == 6 and len(set(positions.alibi_slopes(6).tolist())) == 6
  q = k = jnp.zeros((1, 5, 4, 4))

  @jax.jit
  def bias(q, k):
    out = []
    for name in ("alibi", "alibi_directional"):
      alibi = positions.make(name, 4, 4)
      out.append(alibi.apply({}, q, k, 0, method=alibi.terms).bias_fn(jnp.arange(5), jnp.arange(5)))
    return out

  symmetric, directional = map(np.asarray, bias(q, k))  # [h, q, k]
  d = np.arange(5)[None, :] - np.arange(5)[:, None]
  np.testing.assert_allclose(symmetric, -positions.alibi_slopes(4)[:, None, None] * np.abs(d), rtol=1e-6)
  # Directional: half the slope for keys right of the query.
  np.testing.assert_allclose(directional, np.where(d > 0, 0.5, 1.0) * symmetric, rtol=1e-6)


def test_sinusoid_values():
  scheme = positions.make("sinusoidal", 2, 4)
  table, embedded = map(np.asarray, jax.jit(lambda p, x: (positions.sinusoid(p, 8),
                                                          scheme.apply({}, x, 3, method=scheme.embed)))(
      jnp.arange(6), jnp.zeros((1, 3, 8))))
  angles = np.arange(6)[:, None] / 10000.0 ** (2 * np.arange(4) / 8)
  # PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)).
  np.testing.assert_allclose(table[:, 0::2], np.sin(angles), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(table[:, 1::2], np.cos(angles), rtol=1e-5, atol=1e-6)
  # embed(x, offset) adds the rows of positions offset, offset + 1, ...
  np.testing.assert_allclose(embedded[0], table[3:6], rtol=1e-5, atol=1e-6)


def test_shaw_adds_the_sinusoids_only_when_asked():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 8)), jnp.float32)
  sinusoidal = positions.make("sinusoidal", 2, 4)
  expected = np.asarray(sinusoidal.apply({}, x, 3, method=sinusoidal.embed))
  for add, want in ((True, expected), (False, np.asarray(x))):
    shaw = positions.make("shaw", 2, 4, options=dict(add_sinusoidal=add))
    np.testing.assert_array_equal(np.asarray(shaw.apply({}, x, 3, method=shaw.embed)), want)
  assert not np.allclose(expected, x)


def test_learned_rejects_sequences_longer_than_its_table(random_variables):
  scheme = positions.make("learned", 2, 4, max_length=4)
  with pytest.raises(ValueError, match=r"sequence length 5 exceeds the learned table's max_length 4"):
    random_variables(scheme, jnp.zeros((1, 5, 8)), method=scheme.embed)


def test_rope_odd_head_dim_raises():
  with pytest.raises(ValueError, match=r"rope needs an even head_dim, got 3"):
    positions.rotate(jnp.zeros((1, 2, 1, 3)), jnp.arange(2))


# ----------------------------------------------------------------------------
# A scheme registered by a test runs in the layer, with its own option.


def test_a_scheme_registered_here_runs_in_the_layer(random_variables):
  # A toy scheme: one learned scalar per head and clipped distance clip(j - i, -c, c), c = toy_clip.
  name = "toy_clipped_bias"
  assert name not in positions.SCHEMES

  class ClippedBias(positions.Scheme):
    @dataclasses.dataclass(frozen=True)
    class Options:
      toy_clip: int = 2

      def check(self, head_dim=None):
        if self.toy_clip < 0:
          raise ValueError(f"toy_clip must be >= 0, got {self.toy_clip}")

    @nn.compact
    def terms(self, query, key, q_offset=0):
      c = self.options.toy_clip
      table = self.param("bias", nn.initializers.normal(0.02), (self.num_heads, 2 * c + 1))
      bias_fn = lambda q_pos, k_pos: table[:, jnp.clip(k_pos[None, :] - q_pos[:, None], -c, c) + c]
      return positions.Terms(query, key, bias_fn=bias_fn)

  positions.register(name)(ClippedBias)
  try:
    assert positions.get(name) is ClippedBias and positions.defaults(name) == {"toy_clip": 2}
    with pytest.raises(ValueError, match=r"toy_clip must be >= 0, got -1"):
      positions.make(name, H, F // H, options={"toy_clip": -1})
    # Cross-attention of 3 queries at positions 2..4 over 6 keys, batch element 1 padded to 4 keys.
    nq, nk, q_offset = 3, 6, 2
    rng = np.random.default_rng(7)
    xq, xkv = (jnp.asarray(rng.normal(size=(2, n, F)), jnp.float32) for n in (nq, nk))
    valid = jnp.asarray(np.arange(nk)[None, :] < np.array([[nk], [4]]))
    make = lambda implementation: MultiHeadAttention(
        num_heads=H, position=name, position_options={"toy_clip": 2}, implementation=implementation)
    params = random_variables(make("dense"), xq, xkv, key_valid=valid)
    table = np.asarray(params["params"]["position"]["bias"])
    assert table.shape == (H, 5)
    # The same bias, from the table by hand: [h, q, k] at distance j - (q_offset + i).
    distance = np.arange(nk)[None, :] - (q_offset + np.arange(nq))[:, None]
    bias = jnp.asarray(table[:, np.clip(distance, -2, 2) + 2][None])
    assert len(np.unique(np.clip(distance, -2, 2))) == 5  # every row of the table is used

    @jax.jit
    def run(params):
      p = params["params"]
      proj = lambda name, x: jnp.einsum("blf,fhd->blhd", x, p[name]["kernel"])
      want = attn.dot_product_attention(proj("query", xq), proj("key", xkv), proj("value", xkv), bias=bias,
                                        mask=attn.padding_mask(None, valid))
      want = jnp.einsum("blhd,hdf->blf", want, p["out"]["kernel"])
      return want, [make(i).apply(params, xq, xkv, key_valid=valid, q_offset=q_offset) for i in ("dense", "chunked")]

    want, got = run(params)
    for implementation, out in zip(("dense", "chunked"), got):
      np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5, err_msg=implementation)
    # The bias matters: without it the output differs (the comparison can fail).
    no_bias = jax.tree_util.tree_map(lambda x: x, params)
    no_bias["params"]["position"]["bias"] = jnp.zeros_like(no_bias["params"]["position"]["bias"])
    assert np.max(np.abs(np.asarray(run(no_bias)[1][0]) - np.asarray(want))) > 1e-3
  finally:
    del positions.SCHEMES[name]
  assert name not in positions.SCHEMES
