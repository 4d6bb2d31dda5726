"""Property tests: attention equals the float64 reference, and a bad argument or config value fails naming it.

Hypothesis draws the cases under one settings profile (``rpr``): a fixed
number of examples, derandomized, so a run is reproducible and its time is
bounded. XLA compilation, once per drawn shape and option set, is what the
attention properties spend their time on, so shapes come from a few small
sizes and each case compiles once, with XLA's optimisation passes off (on
arrays this small they cost more than they save).

Known gaps are ``xfail(strict=True)`` cases: they start failing when the gap
is closed, so that the mark is removed.
"""

import functools
import math
import os
import pathlib
import re
import subprocess
import sys
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from configs import tiny
from rpr import attention as attn
from rpr import data, optim
from rpr import model as model_lib
from rpr.attention import positions, reference
from rpr import config as rpr_config
from tests.test_train import ConfigError, validate

ROOT = pathlib.Path(__file__).resolve().parents[1]

settings.register_profile("rpr", max_examples=25, derandomize=True, deadline=None)
PROFILE = settings.get_profile("rpr")
# Each attention example compiles (1-4 s of CPU), each layer example too (about 0.5 s): fewer of those.
ATTENTION, LAYER = settings(PROFILE, max_examples=20), settings(PROFILE, max_examples=12)
# A known gap fails on its first example; shrinking it would only cost time.
GAP = settings(PROFILE, max_examples=5, phases=[Phase.explicit, Phase.generate])

# |got - want| <= tol * (1 + |want|) against the float64 reference fed the same (rounded) inputs, on every row:
# outputs in every dtype, gradients in float32. What differs is rounding: of the output and, in dense attention
# and the layer, of the logits, weights and projections too. The worst seen over ~200 drawn cases is about one
# epsilon in the half precisions (bfloat16 0.009, float16 0.001, both in the layer) and 6 in float32 (gradients,
# 7e-7); the tolerances are 8 epsilons for the half precisions and the suite's usual 1e-5 for float32.
TOLERANCE = {"float32": 1e-5, "bfloat16": 8 * 2 ** -7, "float16": 8 * 2 ** -10}
DTYPES = tuple(TOLERANCE)

# XLA's optimisation passes off (and each program one LLVM module, as everywhere in the tests: conftest.py).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                                    "xla_llvm_disable_expensive_passes": True})

# ----------------------------------------------------------------------------
# Attention: dense and chunked equal the float64 reference, values and float32 gradients.

Q_LENGTHS, K_LENGTHS = (6, 13, 1), (17, 6, 4)
OFFSETS = st.integers(-8, 8)
TERMS = st.sampled_from(((True, True), (True, False), (False, True), (False, False)))  # (a^K, a^V)
FAR = 32  # a clipping distance beyond every |j - i - offset| of these lengths and offsets
BLOCKS = ((2, 3), (3, 4), (16, 16))  # chunked (block_q, block_k): blocks that split the lengths, and one that does not


class Case(NamedTuple):
  """The static part of one attention call: each distinct Case compiles once."""
  dtype: str
  shape: tuple  # (batch, q_length, k_length, heads, head_dim)
  max_distance: int  # Shaw's k
  use_keys: bool  # a^K
  use_values: bool  # a^V
  shared: bool  # one table for all heads
  causal: bool
  window: Optional[int]
  padded: bool  # Mask.key_valid given
  offset: Optional[int]  # q_offset and Relative.offset; None: traced, as in cached decoding
  blocks: tuple


@st.composite
def attention_cases(draw):
  """``(Case, seed of the values, valid keys per batch element, offset)``."""
  shape = tuple(draw(st.sampled_from(s)) for s in ((1, 2), Q_LENGTHS, K_LENGTHS, (1, 3), (1, 4)))
  offset = draw(OFFSETS)
  use_keys, use_values = draw(TERMS)
  case = Case(dtype=draw(st.sampled_from(DTYPES)), shape=shape, max_distance=draw(st.sampled_from((2, FAR, 0))),
              use_keys=use_keys, use_values=use_values, shared=draw(st.booleans()),
              causal=draw(st.booleans()), window=draw(st.sampled_from((None, 0, 2, 5))), padded=draw(st.booleans()),
              offset=draw(st.sampled_from((offset, None))), blocks=draw(st.sampled_from(BLOCKS)))  # static or traced
  batch, _, k_length = shape[:3]
  pads = draw(st.lists(st.integers(0, k_length), min_size=batch, max_size=batch)) if case.padded else [0] * batch
  lengths = [k_length - p for p in pads]
  return case, draw(st.integers(0, 2 ** 16)), lengths, offset


def attend(implementation, case, q, k, v, key_table, value_table, key_valid, offset):
  mask = attn.Mask(key_valid=key_valid, causal=case.causal, window=case.window)
  shaw = case.use_keys or case.use_values
  rel = attn.Relative(key_table, value_table, offset=offset) if shaw else None
  if implementation == "dense":
    return attn.dot_product_attention(q, k, v, mask=mask, relative=rel, q_offset=offset)
  block_q, block_k = case.blocks
  return attn.chunked_attention(q, k, v, mask=mask, relative=rel, q_offset=offset, block_q=block_q, block_k=block_k)


@functools.partial(jit, static_argnames="case")
def library(case, q, k, v, key_table, value_table, key_valid, offset, cotangent):
  """``{implementation: (output, gradients w.r.t. (q, k, v, key_table, value_table) or None)}``."""
  offset = offset if case.offset is None else case.offset
  out = {}
  for implementation in ("dense", "chunked"):
    f = lambda *args: attend(implementation, case, *args, key_valid, offset)
    if case.dtype != "float32":
      out[implementation] = f(q, k, v, key_table, value_table), None
      continue
    z, vjp = jax.vjp(f, q, k, v, key_table, value_table)
    out[implementation] = z, vjp(cotangent)
  return out


@jit
def oracle(q, k, v, key_table, value_table, mask, cotangent, offset):
  """The float64 reference and its gradients (``jax.vjp``, i.e. ``jax.grad`` of ``sum(z * cotangent)``)."""
  f = lambda *args: reference.shaw_attention_reference(*args, offset, mask)
  z, vjp = jax.vjp(f, q, k, v, key_table, value_table)
  return z, vjp(cotangent)


def visible(shape, lengths, causal, window, offset) -> np.ndarray:
  """``[batch, 1, q, k]``: what :class:`~rpr.attention.Mask` allows, written from its docstring.

  Key ``j`` is valid and, for the query at ``offset + i``, ``j <= offset + i`` if causal and
  ``|j - (offset + i)| <= window`` if windowed.
  """
  _, nq, nk = shape[:3]
  rel = np.arange(nk)[None, :] - (offset + np.arange(nq)[:, None])
  near = (rel <= 0) | (not causal)
  if window is not None:
    near = near & (np.abs(rel) <= window)
  valid = np.arange(nk)[None, :] < np.asarray(lengths)[:, None]
  return valid[:, None, None, :] & near


def float64(x):
  return None if x is None else jnp.asarray(np.asarray(x, np.float64))


def assert_rows_match(got, want, empty, tol, what):
  """Rows without any key are exactly zero; every row is within ``tol`` of the reference."""
  got = np.asarray(got, np.float64)
  assert np.all(np.isfinite(got)), what
  assert np.all(got[np.broadcast_to(empty, got.shape)] == 0), f"{what}: a row without keys is not zero"
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)


@ATTENTION
@given(attention_cases())
def test_attention_matches_the_float64_reference(drawn):
  case, seed, lengths, offset = drawn
  b, nq, nk, h, d = case.shape
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), case.dtype)
  table_shape = (2 * case.max_distance + 1, d) if case.shared else (h, 2 * case.max_distance + 1, d)
  args = (normal(b, nq, h, d), normal(b, nk, h, d), normal(b, nk, h, d),
          normal(*table_shape) if case.use_keys else None, normal(*table_shape) if case.use_values else None)
  cotangent = jnp.asarray(rng.normal(size=(b, nq, h, d)), jnp.float32)
  mask = visible(case.shape, lengths, case.causal, case.window, offset)
  key_valid = jnp.asarray(np.arange(nk)[None, :] < np.asarray(lengths)[:, None]) if case.padded else None
  got = library(case, *args, key_valid, jnp.int32(offset), cotangent)
  with jax.enable_x64(True):
    want, want_grads = oracle(*map(float64, args), jnp.asarray(mask), float64(cotangent), offset)
  empty = np.transpose(~mask.any(-1), (0, 2, 1))[..., None]  # [b, q, 1, 1]: rows without any key
  tol = TOLERANCE[case.dtype]
  for implementation, (out, grads) in got.items():
    assert out.dtype == case.dtype
    assert_rows_match(out, want, empty, tol, implementation)
    if grads is not None:  # q_i reaches only row i of the output: an empty row's dq_i is exactly zero
      assert np.all(np.asarray(grads[0])[np.broadcast_to(empty, out.shape)] == 0), implementation
    for name, g, want_g in zip(("q", "k", "v", "key_table", "value_table"), grads or (), want_grads):
      if want_g is not None:
        np.testing.assert_allclose(np.asarray(g, np.float64), want_g, rtol=tol, atol=tol,
                                   err_msg=f"{implementation}: gradient w.r.t. {name}")


# ----------------------------------------------------------------------------
# The layer: MultiHeadAttention with Shaw's scheme equals its projections around the float64 reference.

FEATURES = 8


class LayerCase(NamedTuple):
  dtype: str
  shape: tuple  # (batch, q_length, k_length, heads, head_dim); equal lengths: self-attention
  implementation: str
  options: tuple  # Shaw's position_options as (key, value) pairs
  causal: bool
  window: Optional[int]
  offset: int  # q_offset


@st.composite
def layer_cases(draw):
  """``(LayerCase, seed of the inputs and parameters, valid keys per batch element)``."""
  shape = tuple(draw(st.sampled_from(s)) for s in ((1, 2), Q_LENGTHS, K_LENGTHS, (1, 2), (1, 4)))
  options = (("max_distance", draw(st.sampled_from((0, 2, FAR)))), ("use_keys", draw(st.booleans())),
             ("use_values", draw(st.booleans())), ("share_heads", draw(st.booleans())))
  case = LayerCase(dtype=draw(st.sampled_from(DTYPES)), shape=shape,
                   implementation=draw(st.sampled_from(("dense", "chunked"))), options=options,
                   causal=draw(st.booleans()), window=draw(st.sampled_from((None, 0, 2))), offset=draw(OFFSETS))
  lengths = draw(st.lists(st.integers(0, shape[2]), min_size=shape[0], max_size=shape[0]))
  return case, draw(st.integers(0, 2 ** 16)), lengths


def layer(case) -> attn.MultiHeadAttention:
  _, _, _, h, d = case.shape
  return attn.MultiHeadAttention(num_heads=h, head_dim=d, position="shaw", position_options=dict(case.options),
                                 implementation=case.implementation, causal=case.causal, window=case.window,
                                 dtype=jnp.dtype(case.dtype))


@functools.partial(jit, static_argnames="case")
def apply_layer(case, params, x_q, x_kv, key_valid):
  return layer(case).apply(params, x_q, x_kv, key_valid=key_valid, q_offset=case.offset)


@jit
def layer_oracle(params, x_q, x_kv, mask, offset):
  """The layer's projections in float64 around the reference attention."""
  project = lambda x, name: jnp.einsum("blf,fhd->blhd", x, params[name]["kernel"])
  tables = params.get("position", {})
  z = reference.shaw_attention_reference(project(x_q, "query"), project(x_kv, "key"), project(x_kv, "value"),
                                         tables.get("key_table"), tables.get("value_table"), offset, mask)
  return jnp.einsum("blhd,hdf->blf", z, params["out"]["kernel"])


@LAYER
@given(layer_cases())
def test_layer_matches_the_float64_reference(drawn):
  case, seed, lengths = drawn
  b, nq, nk = case.shape[:3]
  rng = np.random.default_rng(seed)
  x_q = rng.normal(size=(b, nq, FEATURES)).astype(np.float32)
  x_kv = x_q if nq == nk else rng.normal(size=(b, nk, FEATURES)).astype(np.float32)
  shapes = jax.eval_shape(lambda: layer(case).init(jax.random.PRNGKey(0), x_q, x_kv))["params"]
  # N(0, 1/features) parameters keep the projections of unit inputs near unit scale.
  params = jax.tree.map(lambda s: (rng.normal(size=s.shape) / math.sqrt(FEATURES)).astype(np.float32), shapes)
  key_valid = np.arange(nk)[None, :] < np.asarray(lengths)[:, None]
  got = apply_layer(case, {"params": params}, x_q, x_kv, key_valid)
  mask = visible(case.shape, lengths, case.causal, case.window, case.offset)
  with jax.enable_x64(True):
    want = layer_oracle(jax.tree.map(float64, params), float64(x_q), float64(x_kv), jnp.asarray(mask), case.offset)
  assert got.dtype == case.dtype
  empty = np.transpose(~mask.any(-1), (0, 2, 1))  # [b, q, 1]
  assert_rows_match(got, want, empty, TOLERANCE[case.dtype], f"{case.dtype} {case.implementation}")


# ----------------------------------------------------------------------------
# Bad arguments fail before any work, naming the argument. Calls are traced by jax.eval_shape: no compilation.

B, L, H, D = 2, 4, 2, 3
SPEC = jax.ShapeDtypeStruct((B, L, H, D), jnp.float32)


def not_an_int(minimum):
  """Ints below ``minimum`` and values of other types (floats, bools): none is an int >= minimum."""
  return st.one_of(st.integers(max_value=minimum - 1), st.floats(), st.booleans())


def wrong_table():
  """Shapes of a^K / a^V tables that are not ``[2k+1, D]`` or ``[H, 2k+1, D]`` for any k (even rows give none)."""
  shapes = st.one_of(st.tuples(st.integers(1, 6), st.integers(1, 5)),
                     st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5)))
  return shapes.filter(lambda s: s[-1] != D or s[-2] % 2 == 0 or len(s) == 3 and s[0] != H)


@st.composite
def bad_calls(draw):
  """``(name, implementation, keyword arguments)``: a call wrong in one argument, which the error must name."""
  implementation = draw(st.sampled_from(("dense", "chunked", "layer")))
  if implementation == "layer":
    name = draw(st.sampled_from(("window", "max_distance", "implementation")))
    if name == "implementation":
      return name, implementation, dict(implementation=draw(st.text(max_size=8).filter(
          lambda s: s not in attn.IMPLEMENTATIONS)))
    value = draw(not_an_int(0))
    return name, implementation, dict(window=value) if name == "window" else dict(
        position="shaw", position_options={"max_distance": value})
  names = ["query", "key", "value", "window", "key_table", "value_table", "key_valid", "dropout_rate"]
  name = draw(st.sampled_from(names + (["block_q", "block_k"] if implementation == "chunked" else [])))
  if name in ("query", "key", "value"):
    return name, implementation, {name: jax.ShapeDtypeStruct(SPEC.shape, draw(st.sampled_from((jnp.int32, bool))))}
  if name == "window":
    return name, implementation, dict(mask=attn.Mask(window=draw(not_an_int(0))))
  if name in ("key_table", "value_table"):
    return name, implementation, dict(relative=attn.Relative(**{name: np.zeros(draw(wrong_table()))}))
  if name == "key_valid":
    shape = draw(st.tuples(st.integers(1, 4), st.integers(1, 6)).filter(lambda s: s[0] not in (1, B) or s[1] != L))
    return name, implementation, dict(mask=attn.Mask(key_valid=np.ones(shape, bool)))
  if name == "dropout_rate":
    rate = draw(st.one_of(st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0), st.just(math.nan)))
    return name, implementation, dict(dropout_rate=rate)
  return name, implementation, {name: draw(not_an_int(1))}


def trace(implementation, q_offset=0, query=SPEC, key=SPEC, value=SPEC, **kwargs):
  """Traces one call (``implementation``: dense, chunked or layer) without compiling it."""
  if implementation == "layer":
    model = attn.MultiHeadAttention(num_heads=H, **kwargs)
    x = jax.ShapeDtypeStruct((B, L, H * D), jnp.float32)
    return jax.eval_shape(lambda x: model.init(jax.random.PRNGKey(0), x, q_offset=q_offset), x)
  f = attn.dot_product_attention if implementation == "dense" else attn.chunked_attention
  return jax.eval_shape(functools.partial(f, q_offset=q_offset, **kwargs), query, key, value)


@PROFILE
@given(bad_calls())
def test_bad_arguments_raise_naming_them(call):
  name, implementation, kwargs = call
  with pytest.raises((TypeError, ValueError), match=re.escape(name)):
    trace(implementation, **kwargs)


@GAP
@given(st.sampled_from(("dense", "chunked", "layer")), st.integers(-8, 7).map(lambda n: n + 0.5))
def test_a_fractional_offset_raises_naming_it(implementation, offset):
  kwargs = dict(mask=attn.Mask(causal=True), relative=attn.Relative(np.zeros((3, D)), offset=offset))
  if implementation == "layer":
    kwargs = dict(causal=True, position="shaw", position_options={"max_distance": 1})
  with pytest.raises((TypeError, ValueError), match="offset"):
    trace(implementation, q_offset=offset, **kwargs)


# ----------------------------------------------------------------------------
# The run config: a bad value of any key fails validate with a ConfigError naming the key.

TINY = tiny.get_config().to_dict()


def config_with(path: str, value, setup=()):
  """configs/tiny.py with ``value`` at the dotted ``path`` (and the ``setup`` pairs), as a ConfigDict.

  Built from a plain dict, so that each value keeps its type (assigning into a
  ConfigDict converts or refuses a value of another type before validate sees it).
  """
  tree = tiny.get_config().to_dict()
  for key, v in (*setup, (path, value)):
    *parents, leaf = key.split(".")
    node = tree
    for p in parents:
      node = node[p]
    node[leaf] = v
  return ml_collections.ConfigDict(tree)


def ints_below(minimum, optional=False):
  """Ints below ``minimum`` and values of other types (None too unless ``optional``)."""
  other = st.one_of(st.floats(), st.text(max_size=3), st.booleans())
  return st.one_of(st.integers(max_value=minimum - 1), other, *([] if optional else [st.none()]))


def reals_outside(lo, hi=math.inf, lo_open=False, hi_open=False):
  """Reals outside the range, NaN, infinity, and values of other types."""
  outside = [st.floats(max_value=lo, exclude_max=not lo_open), st.just(math.nan), st.just(math.inf)]
  if hi < math.inf:
    outside.append(st.floats(min_value=hi, exclude_min=not hi_open))
  return st.one_of(*outside, st.text(max_size=3), st.booleans(), st.none())


def names_other_than(allowed, *more):
  """Unknown names (and non-strings): of a data set, scheme, optimizer, ..."""
  return st.one_of(st.text(max_size=8), st.integers(), st.none(), st.sampled_from(more or ("",))).filter(
      lambda v: v not in allowed)


def not_bool():
  return st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none())


def new_key(parent, existing):
  """``(id, strategy)`` of unknown keys under ``parent`` (a dotted prefix, "" for the top level)."""
  keys = st.from_regex(r"[a-z][a-z_]{0,9}", fullmatch=True).filter(lambda k: k not in existing)
  return parent + "<unknown key>", keys.map(lambda k: parent + k)


def bad(path, values, *setup):
  """``(id, strategy of (path, value, setup))``: ``values`` at ``path`` (or ``(id, strategy of paths)``), after
  the ``setup`` (path, value) pairs."""
  name, paths = (path, st.just(path)) if isinstance(path, str) else path
  return name, st.tuples(paths, values, st.just(setup))


SHAW = TINY["model"]["shaw"]
BAD_VALUES = [
    bad("dataset", names_other_than(data.names())),
    bad(("dataset=<list>", st.just("dataset")), st.lists(st.text(max_size=3))),
    bad(new_key("", TINY), st.integers()),
    *(bad(k, ints_below(1)) for k in ("batch_size", "eval_batch_size", "min_length", "num_eval_examples",
                                      "warmup_steps", "beam_size", "decode_extra_length", "eval_every_steps",
                                      "log_every_steps", "checkpoint_every_steps", "keep_checkpoints")),
    bad("max_length", ints_below(TINY["min_length"])),
    bad("long_max_length", ints_below(TINY["max_length"] + 1)),
    bad("eval_splits", st.one_of(st.text(max_size=5), st.integers(), st.none(), st.tuples(st.integers()),
                                 st.tuples(st.text(max_size=5).filter(lambda s: s not in ("valid", "long"))))),
    bad("eval_by_length", not_bool()),
    bad(("eval_by_length=<0 or 1>", st.just("eval_by_length")), st.sampled_from((0, 1, 0.0, 1.0))),
    *(bad(k, ints_below(0)) for k in ("seed", "num_train_steps")),
    bad("max_eval_batches", ints_below(1, optional=True)),
    bad("optimizer", names_other_than(optim.OPTIMIZERS)),
    bad("schedule", names_other_than(optim.SCHEDULES, "linear")),
    bad("decode_method", names_other_than(rpr_config.DECODE_METHODS, "sample")),
    *(bad(k, reals_outside(0.0, lo_open=True)) for k in ("learning_rate", "adam_eps")),
    bad(("learning_rate=<int beyond the floats>", st.just("learning_rate")), st.integers(min_value=2 ** 1024)),
    *(bad(k, reals_outside(0.0)) for k in ("weight_decay", "beam_alpha")),
    *(bad(k, reals_outside(0.0, 1.0)) for k in ("adam_b1", "adam_b2")),
    bad("label_smoothing", reals_outside(0.0, 1.0, hi_open=True)),
    # None is no clipping, and so is inf.
    bad("grad_clip_norm", st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.text(max_size=3), st.booleans())),
    *(bad("model." + k, ints_below(1)) for k in ("d_model", "d_ff", "num_decoder_layers")),
    bad("model.num_heads", st.one_of(ints_below(1), st.integers(1, 99).filter(lambda n: TINY["model"]["d_model"] % n))),
    bad("model.num_encoder_layers", ints_below(0)),
    bad("model.max_length", ints_below(TINY["long_max_length"] + 1)),  # the longest target and EOS must fit
    *(bad("model." + k, reals_outside(0.0, 1.0, hi_open=True)) for k in ("dropout_rate", "attention_dropout_rate")),
    *(bad("model." + k, not_bool()) for k in ("pre_layer_norm", "share_embeddings")),
    bad("model.position", names_other_than(positions.SCHEMES, "absolute")),
    bad(("model.position=<list>", st.just("model.position")), st.lists(st.text(max_size=3))),
    bad("model.cross_position", names_other_than(model_lib.cross_schemes(), "sinusoidal", "learned")),
    bad("model.dtype", names_other_than(model_lib.DTYPES, "float16", "float64")),
    bad("model.attention_implementation", names_other_than(("dense", "chunked"), "additive")),
    bad(new_key("model.", TINY["model"]), st.integers()),
    bad("model.shaw.max_distance", ints_below(0)),
    *(bad("model.shaw." + k, not_bool()) for k in ("use_keys", "use_values", "share_heads", "add_sinusoidal")),
    bad(new_key("model.shaw.", SHAW), st.integers()),
    bad("model.shaw", st.one_of(st.integers(), st.text(max_size=3))),
    bad("model.t5.num_buckets", ints_below(2), ("model.position", "t5")),
    bad(("model.t5.num_buckets<unused scheme>", st.just("model.t5.num_buckets")),
        st.integers(max_value=1)),  # the options of schemes the model does not use too
    bad("model.t5.horizon", ints_below(TINY["model"]["t5"]["num_buckets"]), ("model.position", "t5")),
    bad("model.rope.rope_base", st.one_of(st.floats(max_value=1.0), st.just(math.nan), st.none(),
                                          st.text(max_size=3), st.booleans()), ("model.position", "rope")),
    bad(("model.rope.rope_base=<inf>", st.just("model.rope.rope_base")),
        st.sampled_from((math.inf, 10 ** 400)), ("model.position", "rope")),
    bad("model.learned.learned_init_std", reals_outside(0.0, lo_open=True), ("model.position", "learned")),
]


def assert_names_the_key(path, value, setup):
  with pytest.raises(ConfigError) as error:
    validate(config_with(path, value, setup), num_devices=1)
  *parents, leaf = path.split(".")
  message = str(error.value)
  assert "config." + ".".join(parents or [leaf]) in message and re.search(rf"\b{leaf}\b", message), message


# validate takes milliseconds: a few examples of every key instead of a sample of the keys.
@pytest.mark.parametrize("strategy", [s for _, s in BAD_VALUES], ids=[name for name, _ in BAD_VALUES])
def test_a_bad_config_value_fails_validate_naming_the_key(strategy):
  settings(PROFILE, max_examples=5)(given(strategy)(lambda drawn: assert_names_the_key(*drawn)))()


# ----------------------------------------------------------------------------
# run.py: a bad value is one error line and exit status 2. A few fixed cases: one run.py process for each way a bad
# value ends (a value rpr.config.parse refuses, a key the config lacks), each a process that imports JAX; the
# others run.py in this process (conftest.py's run_py_here), the same flag parser and main.

RUN_PY_ERRORS = {"seed": "-1", "learning_rate": "nan", "model.position": "absolute", "no_such_key": "1"}
IN_PROCESS = ("learning_rate", "model.position")  # refused by rpr.config.parse, as seed is


@pytest.fixture(scope="module")
def run_py_errors(tmp_path_factory):
  """``{key: (exit status, stderr)}`` of ``run.py --config.<key>=<bad value>`` for the keys not IN_PROCESS, the
  processes run side by side."""
  workdir = tmp_path_factory.mktemp("run_py") / "run"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = {key: subprocess.Popen([sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={workdir}",
                                  f"--config.{key}={value}"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
           for key, value in RUN_PY_ERRORS.items() if key not in IN_PROCESS}
  out = {}
  for key, p in procs.items():
    _, stderr = p.communicate(timeout=300)
    out[key] = p.returncode, stderr
  assert not workdir.exists()  # nothing was written
  return out


def _run_py_error(run_py_errors, run_py_here, tmp_path, key):
  """``(exit status, stderr)`` of ``run.py --config.<key>=<bad value>``: a process's, or in this process."""
  if key not in IN_PROCESS:
    return run_py_errors[key]
  workdir = tmp_path / "run"
  proc = run_py_here(["--config=configs/tiny.py", f"--workdir={workdir}", f"--config.{key}={RUN_PY_ERRORS[key]}"])
  assert not workdir.exists()  # nothing was written
  return proc.returncode, proc.stderr


@pytest.mark.parametrize("key", RUN_PY_ERRORS)
def test_run_py_exits_2_with_one_error_line_naming_the_key(run_py_errors, run_py_here, tmp_path, key):
  status, stderr = _run_py_error(run_py_errors, run_py_here, tmp_path, key)
  errors = [line for line in stderr.splitlines() if line.startswith("run.py: error:")]
  assert status == 2 and len(errors) == 1 and key in errors[0] and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("key", RUN_PY_ERRORS)
def test_run_py_stderr_is_the_error_line_only(run_py_errors, run_py_here, tmp_path, key):
  status, stderr = _run_py_error(run_py_errors, run_py_here, tmp_path, key)
  assert status == 2 and len(stderr.splitlines()) == 1, stderr
