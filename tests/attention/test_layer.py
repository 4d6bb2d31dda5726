"""rpr.attention.MultiHeadAttention with every position scheme and implementation.

Absolute schemes run through :class:`Block`: their ``embed`` on the inputs,
then the layer with ``none`` (the layer refuses their names).

Parameters come from ``random_variables`` (conftest: shapes by eval_shape,
values from numpy) and every model is applied under jax.jit: XLA compilation is
what these tests spend their time on, so each compiles as little as it can.
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rpr import attention as attn
from rpr.attention import positions
from rpr.attention import reference
from rpr.attention import MultiHeadAttention

# Programs compiled as one LLVM module (see tests/attention/test_chunked.py).

# Explicit, so that registering a scheme fails test_layer_tests_cover_every_registered_scheme
# until it is added here (and to COVERAGE in test_positions.py).
SCHEMES = ("none", "sinusoidal", "learned", "shaw", "t5", "rope", "alibi", "alibi_directional")
F, H, L = 8, 2, 5  # features, heads (head_dim 4), length
# The options of the schemes that have some; the others take their defaults.
OPTIONS = {"shaw": dict(max_distance=2), "t5": dict(num_buckets=8, horizon=16)}
MAX_LENGTH = 16
WINDOW = 2

# How the layer attends: (implementation, window). "local" is restricted attention, |j - i| <= WINDOW.
KINDS = {"dot": ("dense", None), "additive": ("additive", None), "local": ("dense", WINDOW),
         "chunked": ("chunked", None), "chunked_local": ("chunked", WINDOW)}


def in_attention(position):
  """The scheme the layer gets: absolute schemes act at the embeddings (:class:`Block`), so the layer gets 'none'."""
  return position if positions.get(position).acts_in_attention() else "none"


def layer(position, kind="dot", **kw):
  implementation, window = KINDS[kind]
  position = in_attention(position)
  return MultiHeadAttention(num_heads=H, position=position, position_options=OPTIONS.get(position),
                            max_length=MAX_LENGTH, implementation=implementation, window=window, **kw)


def inputs(batch=1, seed=0, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, L, F)), dtype)


# Kinds share all scheme code, so the checks run dot for every scheme and the other kinds (every one of them
# at least once) for the schemes acting inside attention in different ways. Shaw's terms need dot-product
# logits, so shaw + additive is not a kind; test_chunked.py holds chunked to dense for every scheme.
SOME_KINDS = [(s, "dot") for s in SCHEMES] + [("shaw", "local"), ("t5", "local"), ("rope", "additive"),
                                               ("alibi", "additive"), ("shaw", "chunked"), ("t5", "chunked_local")]


def kinds_with(local, additive):
  """SOME_KINDS with one of its two schemes for local and for additive: every scheme with dot, every kind."""
  return [c for c in SOME_KINDS if c[1] not in ("local", "additive")] + [(local, "local"), (additive, "additive")]


# The four checks below each run every scheme with dot and every other kind; local and additive take their two
# schemes in turn, so that every case of SOME_KINDS meets at least two of the checks (a cover, not the product).
CAUSAL_KINDS, PADDED_KINDS = kinds_with("shaw", "rope"), kinds_with("t5", "alibi")
BFLOAT16_KINDS, DECODE_KINDS = kinds_with("t5", "rope"), kinds_with("shaw", "alibi")


def test_layer_tests_cover_every_registered_scheme():
  assert set(SCHEMES) == set(positions.SCHEMES), "add the new scheme to SCHEMES here and to COVERAGE in test_positions"


def test_every_check_runs_every_kind_and_every_case_meets_two_checks():
  checks = (CAUSAL_KINDS, PADDED_KINDS, BFLOAT16_KINDS, DECODE_KINDS)
  assert all({k for _, k in kinds} == set(KINDS) for kinds in checks)
  assert all(sum(case in kinds for kinds in checks) >= 2 for case in SOME_KINDS)


class Block(nn.Module):
  """``scheme.embed`` then the attention layer: absolute schemes do their work in the embed.

  ``offset`` is the position of ``x[:, 0]`` (a decode step at position ``t`` passes ``t``).
  """

  position: str
  kind: str
  causal: bool
  dtype: object = jnp.float32
  decode: bool = False

  @nn.compact
  def __call__(self, x, key_valid=None, offset=0):
    x = positions.make(self.position, H, F // H, max_length=MAX_LENGTH, options=OPTIONS.get(self.position),
                       name="embed_position").embed(x.astype(self.dtype), offset)
    return layer(self.position, self.kind, causal=self.causal, dtype=self.dtype, decode=self.decode,
                 name="attention")(x, key_valid=key_valid)


# ----------------------------------------------------------------------------
# 5. Masks.


@pytest.mark.parametrize("position,kind", CAUSAL_KINDS)
def test_causal_attention_leaks_nothing(random_variables, position, kind):
  model = Block(position, kind, causal=True)
  x = inputs()
  params = random_variables(model, x)
  jac = np.asarray(jax.jit(jax.jacrev(lambda x: model.apply(params, x)))(x))[0, :, :, 0]  # [L, F, L, F]
  for i in range(L):
    # Output i must not depend on any input after i: exactly zero, not small.
    assert np.all(jac[i, :, i + 1:] == 0.0), f"output {i} depends on later inputs"
    # ...but it does depend on the ones it may see (up to i, within the window
    # for local), or the check above proves nothing.
    window = KINDS[kind][1]
    first = 0 if window is None else max(0, i - window)
    assert all(np.any(jac[i, :, j] != 0.0) for j in range(first, i + 1)), f"output {i} ignores earlier inputs"
    assert np.all(jac[i, :, :first] == 0.0), f"output {i} sees beyond the window"


@pytest.mark.parametrize("position,kind", PADDED_KINDS)
def test_padded_keys_are_ignored(random_variables, position, kind):
  model = Block(position, kind, causal=False)
  x = np.asarray(inputs(batch=2))
  valid = jnp.asarray(np.arange(L)[None, :] < np.asarray([L, 3])[:, None])  # [b, k]
  params = random_variables(model, jnp.asarray(x))
  apply = jax.jit(lambda x: model.apply(params, x, key_valid=valid, mutable=["intermediates"]))
  out, state = apply(jnp.asarray(x))
  if KINDS[kind][0] == "chunked":  # forms no weights, so sows none
    assert "attention" not in state.get("intermediates", {})
  else:
    (weights,) = state["intermediates"]["attention"]["attention_weights"]
    weights = np.asarray(weights)
    assert np.all(weights[1, :, :, 3:] == 0.0)  # exactly zero
    assert np.all(weights[1, :, :, :3].sum(-1) > 0.99)
  # Changing what sits at the padded positions changes nothing the valid queries see.
  x2 = x.copy()
  x2[1, 3:] = 100.0 * np.random.default_rng(1).normal(size=x2[1, 3:].shape)
  out2, _ = apply(jnp.asarray(x2))
  np.testing.assert_array_equal(np.asarray(out2)[:, :3], np.asarray(out)[:, :3])
  np.testing.assert_array_equal(np.asarray(out2)[0], np.asarray(out)[0])


# ----------------------------------------------------------------------------
# 6. jax.jit, grad, bfloat16.


@pytest.mark.parametrize("position,kind", BFLOAT16_KINDS)
def test_jit_grad_bfloat16(random_variables, position, kind):
  causal = kind != "additive"  # cover both mask paths
  model16 = Block(position, kind, causal, jnp.bfloat16)
  model32 = Block(position, kind, causal)
  x = inputs(batch=2)
  mask = jnp.arange(L)[None, :] < jnp.asarray([[L], [4]])  # key_valid [b, k]
  params = random_variables(model32, x, mask)

  @jax.jit
  def run(params, x):
    def loss(params, x):
      out = model16.apply(params, x, mask)
      return jnp.sum(out.astype(jnp.float32) ** 2), out
    (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return value, out, grads, model32.apply(params, x, mask)

  value, out, grads, out32 = run(params, x)
  assert out.dtype == jnp.bfloat16
  out = np.asarray(out.astype(jnp.float32))
  assert np.isfinite(float(value)) and np.all(np.isfinite(out))
  # bfloat16 keeps 8 bits of mantissa: close to float32, not equal.
  np.testing.assert_allclose(out, np.asarray(out32), atol=0.05 * np.max(np.abs(out32)))
  leaves = jax.tree_util.tree_leaves_with_path(grads)
  assert position != "learned" or any("embed_position" in jax.tree_util.keystr(p) for p, _ in leaves)
  for path, g in leaves:
    g = np.asarray(g, np.float32)
    assert np.all(np.isfinite(g)), jax.tree_util.keystr(path)
    assert np.any(g != 0), f"zero gradient for {jax.tree_util.keystr(path)}"


def test_shaw_with_additive_raises(random_variables):
  with pytest.raises(ValueError, match=r"position 'shaw' adds Shaw relative terms, which implementation='additive' "
                                       r"does not support; use 'dense' or 'chunked'"):
    random_variables(layer("shaw", "additive"), inputs())


# ----------------------------------------------------------------------------
# 10. Incremental decoding equals the full causal pass.


@pytest.mark.parametrize("position,kind", DECODE_KINDS)
def test_decode_matches_full_causal_pass(random_variables, position, kind):
  x = inputs(batch=2)
  decoder = Block(position, kind, causal=True, decode=True)
  variables = random_variables(decoder, x)  # a full-length input sizes the cache
  params, cache = variables["params"], variables["cache"]
  full = jax.jit(Block(position, kind, causal=True).apply)({"params": params}, x)

  @jax.jit
  def step(cache, token, t):
    out, state = decoder.apply({"params": params, "cache": cache}, token, offset=t, mutable=["cache"])
    return out, state["cache"]

  outs = []
  for t in range(L):
    out, cache = step(cache, x[:, t:t + 1], jnp.int32(t))
    outs.append(out)
  assert int(cache["attention"]["cache_index"]) == L
  np.testing.assert_allclose(np.concatenate(outs, axis=1), np.asarray(full), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", ["shaw", "t5", "rope", "alibi_directional"])
def test_q_offset_places_the_queries(random_variables, position):
  # Queries 2..3 of x attending over all of x (causal) with q_offset=2 are
  # rows 2..3 of the full causal pass, dense and chunked; at q_offset 0 they are not.
  x = inputs(batch=2)
  model, chunked = layer(position, causal=True), layer(position, "chunked", causal=True)
  params = random_variables(model, x)

  @jax.jit
  def run(params):
    return (model.apply(params, x), model.apply(params, x[:, 2:4], x, q_offset=2),
            chunked.apply(params, x[:, 2:4], x, q_offset=2), model.apply(params, x[:, 2:4], x))

  full, dense, chunked_out, at_zero = map(np.asarray, run(params))
  np.testing.assert_allclose(dense, full[:, 2:4], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(chunked_out, full[:, 2:4], rtol=1e-5, atol=1e-5)
  assert np.max(np.abs(at_zero - full[:, 2:4])) > 1e-3


# ----------------------------------------------------------------------------
# The layer wires Shaw's tables as the paper says.


@pytest.mark.parametrize("share_heads,implementation", [(False, "dense"), (True, "dense"), (False, "chunked")])
def test_shaw_layer_matches_reference(random_variables, share_heads, implementation):
  # Project with the layer's own kernels, attend with rpr.attention.reference
  # (which materialises every a_ij), project out: must equal the layer.
  options = {"max_distance": 1, "share_heads": share_heads}
  model = MultiHeadAttention(num_heads=H, position="shaw", position_options=options, causal=True,
                             implementation=implementation)
  x = inputs(batch=2)
  valid = jnp.arange(L)[None, :] < jnp.asarray([[L], [4]])
  mask = attn.padding_mask(None, valid)
  params = random_variables(model, x)

  @jax.jit
  def both(params, x):
    p = params["params"]
    proj = lambda name: jnp.einsum("blf,fhd->blhd", x, p[name]["kernel"])
    tables = p["position"]
    ref = reference.shaw_attention_reference(
        proj("query"), proj("key"), proj("value"), tables["key_table"], tables["value_table"],
        mask=attn.combine(mask, attn.causal_mask(L, L)))
    return model.apply(params, x, key_valid=valid), jnp.einsum("blhd,hdf->blf", ref, p["out"]["kernel"])

  p = params["params"]["position"]
  assert p["key_table"].shape == ((3, 4) if share_heads else (H, 3, 4))
  got, want = both(params, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# A scheme name the layer takes adds position information; one acting at the embeddings raises.

# Every registered scheme by name, and Shaw's with its sinusoids at the embeddings.
NAMED = [(s, OPTIONS.get(s)) for s in sorted(positions.SCHEMES)] + [("shaw", {**OPTIONS["shaw"],
                                                                              "add_sinusoidal": True})]
PERMUTATION = np.array([3, 0, 4, 1, 2])


@pytest.mark.parametrize("position,options", NAMED)
def test_a_scheme_name_either_raises_or_makes_the_layer_see_order(random_variables, position, options):
  x = inputs(batch=2)
  scheme = positions.make(position, H, F // H, max_length=MAX_LENGTH, options=options)
  embedded = jax.jit(lambda x: scheme.init_with_output(jax.random.PRNGKey(0), x, method="embed")[0])(x)
  model = MultiHeadAttention(num_heads=H, position=position, position_options=options, max_length=MAX_LENGTH)
  if np.any(np.asarray(embedded) != np.asarray(x)):  # its encoding acts at the embeddings: the name is refused
    with pytest.raises(ValueError, match=rf"^position '{position}'.* on the token embeddings, not inside attention, "
                                         r".*\.embed\(x\) .*allowed: \['alibi', 'alibi_directional', 'none', "
                                         r"'rope', 'shaw', 't5'\]"):
      random_variables(model, x)
    return
  out, out_p = map(np.asarray, jax.jit(lambda p: (model.apply(p, x), model.apply(p, x[:, PERMUTATION])))(
      random_variables(model, x)))
  moved = out[:, PERMUTATION]
  scale = np.max(np.abs(out))
  assert np.max(np.abs(moved - out)) > 0.1 * scale  # the permutation moves distinct rows
  if position == "none":  # permuting the positions permutes the output rows, to float rounding
    np.testing.assert_allclose(out_p, moved, rtol=0, atol=1e-5 * scale)
  else:  # order-sensitive, by far more than float rounding (~1e-7 of the scale; ALiBi's small slopes give ~3e-2)
    assert np.max(np.abs(out_p - moved)) > 1e-3 * scale, (position, np.max(np.abs(out_p - moved)) / scale)


def test_a_scheme_module_acting_at_the_embeddings_is_used_as_given(random_variables):
  # The model passes scheme modules (rpr.blocks): an absolute one is its embed's business, not refused here.
  x = inputs()
  scheme = positions.make("shaw", H, F // H, options={**OPTIONS["shaw"], "add_sinusoidal": True}, parent=None)
  model = MultiHeadAttention(num_heads=H, position=scheme)
  named = MultiHeadAttention(num_heads=H, position="shaw", position_options=OPTIONS["shaw"])
  params = random_variables(model, x)
  assert params["params"]["position"]["key_table"].shape == (H, 5, F // H)
  got, want = jax.jit(lambda p: (model.apply(p, x), named.apply(p, x)))(params)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  sinusoidal = positions.make("sinusoidal", H, F // H, parent=None)
  assert random_variables(MultiHeadAttention(num_heads=H, position=sinusoidal), x)["params"].get("position") is None


# ----------------------------------------------------------------------------
# 8. Bad arguments.


@pytest.mark.parametrize("kw,match", [
    (dict(implementation="sparse"), r"unknown attention implementation 'sparse'; allowed: "
                                    r"\['additive', 'chunked', 'dense'\]"),
    (dict(window=-1), r"window must be None or an int >= 0, got -1"),
    (dict(window=-1, implementation="chunked"), r"window must be None or an int >= 0, got -1"),
    (dict(num_heads=3), r"features 8 are not divisible by num_heads 3"),
    (dict(num_heads=0), r"num_heads must be an int >= 1, got 0"),  # not a ZeroDivisionError
    (dict(position="rope", head_dim=3), r"rope needs an even head_dim, got 3"),
    (dict(position="shaw", position_options={"max_distance": -1}),
     r"shaw option max_distance = -1 is not allowed; allowed: an int >= 0 and <= 65536"),
    (dict(position="shaw", position_options={"max_distanse": 2}), r"shaw has no option 'max_distanse'; allowed: "),
])
def test_bad_layer_arguments_raise(random_variables, kw, match):
  model = MultiHeadAttention(**{"num_heads": H, **kw})
  with pytest.raises(ValueError, match=match):
    random_variables(model, inputs())


@pytest.mark.parametrize("kind", ["dot", "chunked"])
def test_layer_key_valid_of_wrong_shape_raises(random_variables, kind):
  with pytest.raises(ValueError, match=r"Mask\.key_valid has shape \(2, 5\); allowed: \[batch, k_length\] = "
                                       r"\(1, 5\) \(or \[1, k_length\]\)"):
    random_variables(layer("none", kind), inputs(), key_valid=jnp.ones((2, L), bool))


def test_decode_step_of_two_tokens_raises(random_variables):
  decoder = layer("none", causal=True, decode=True)
  variables = random_variables(decoder, inputs())
  with pytest.raises(ValueError, match=r"decode step expects one token of shape \(1, 1, 2, 4\), got \(1, 2, 2, 4\)"):
    jax.eval_shape(lambda: decoder.apply(variables, inputs()[:, :2], mutable=["cache"]))


@pytest.mark.parametrize("shape", [(L, F), (1, 1, L, F)])
def test_an_input_of_another_rank_is_named_by_its_own_shape(random_variables, shape):
  with pytest.raises(ValueError, match=rf"inputs_q must be \[batch, length, features\], got shape "
                                       rf"{re.escape(str(shape))}"):
    random_variables(layer("shaw"), jnp.ones(shape))


@pytest.mark.parametrize("kind", ["dot", "chunked", "additive"])
def test_a_query_with_no_allowed_key_outputs_zero_by_design(random_variables, kind):
  # Documented (rpr/attention/dense.py, chunked.py): an all-False mask attends to nothing. Not an error: a
  # token-budget batch pads its row count with rows of PAD only, whose keys are all masked.
  model = layer("none" if kind == "additive" else "shaw", kind)
  variables = random_variables(model, inputs(batch=2))
  valid = jnp.array([[True] * L, [False] * L])
  out, state = jax.jit(lambda v, x: model.apply(v, x, key_valid=valid, mutable=["intermediates"]))(
      variables, inputs(batch=2))
  assert np.isfinite(np.asarray(out)).all()
  bias = variables["params"]["out"].get("bias")
  np.testing.assert_array_equal(np.asarray(out[1]), 0 if bias is None else np.broadcast_to(bias, out[1].shape))
  assert np.abs(np.asarray(out[0])).max() > 0
  for weights in jax.tree_util.tree_leaves(state.get("intermediates", {})):  # dense: the row's weights are zero
    assert not np.asarray(weights)[1].any()
