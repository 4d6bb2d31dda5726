"""Every step lowers for TPU and GPU: ``jax.export`` of the train, eval and decode steps for ``tpu`` and ``cuda``.

This is lowering, not running: the StableHLO module is built for both
platforms on this CPU, and jax.export refuses any custom call that is not
one of its stable, cross-platform targets (a CPU-only LAPACK call would fail
here). Nothing is compiled for, or run on, a GPU or a TPU.

The product schemes x implementations x steps x models x dtypes (8 x 2 x 4 x
2 x 2) is sampled: every value of each factor appears, each scheme with a
different (step, model) pair.
"""

import functools

import jax
import jax.numpy as jnp
import optax
import pytest
from jax import export

from rpr import model as model_lib
from rpr import predict as predict_lib
from rpr import steps
from rpr.attention import positions

PLATFORMS = ("tpu", "cuda")
STEPS = ("train", "eval", "greedy", "beam")
MODELS = ("encoder_decoder", "lm")
IMPLEMENTATIONS = ("dense", "chunked")
DTYPES = ("float32", "bfloat16")


def _cases():
  cases = []
  for i, scheme in enumerate(sorted(positions.SCHEMES)):
    step, model = STEPS[i % 4], MODELS[(i // 4 + i) % 2]
    cases.append((scheme, IMPLEMENTATIONS[i % 2], step, model, DTYPES[(i // 2) % 2]))
  return cases


CASES = _cases()


def test_the_sample_covers_every_value_of_every_factor():
  for k, values in enumerate((sorted(positions.SCHEMES), IMPLEMENTATIONS, STEPS, MODELS, DTYPES)):
    assert {case[k] for case in CASES} == set(values), k
  assert len({(case[2], case[3]) for case in CASES}) == 8  # every step of every model


def _config(scheme: str, implementation: str, model: str, dtype: str) -> model_lib.ModelConfig:
  return model_lib.preset("tiny", vocab_size=32, position=scheme, max_length=32, dtype=dtype,
                          num_encoder_layers=0 if model == "lm" else 1, num_decoder_layers=1,
                          attention_implementation=implementation)


def _lowered(fn, *args):
  """The exported module of ``fn`` on abstract ``args`` for both platforms."""
  abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), args)
  return export.export(jax.jit(fn), platforms=PLATFORMS)(*abstract)


@pytest.mark.parametrize("scheme, implementation, step, model, dtype", CASES, ids=["-".join(c) for c in CASES])
def test_each_step_lowers_for_tpu_and_cuda(scheme, implementation, step, model, dtype):
  config = _config(scheme, implementation, model, dtype)
  net = model_lib.build(config)
  length_in = 0 if model == "lm" else 8
  inputs, targets = jnp.ones((2, length_in), jnp.int32), jnp.ones((2, 8), jnp.int32)
  tx = optax.adam(1e-3)
  init = functools.partial(steps.init_state, model=net, tx=tx, input_length=length_in, target_length=8)
  state = jax.eval_shape(init, jax.random.PRNGKey(0))
  batch = {"inputs": inputs, "targets": targets}
  if step == "train":
    fn = functools.partial(steps.train_step, model=net, tx=tx, schedule=lambda s: 1e-3, label_smoothing=0.1)
    exported = _lowered(fn, state, batch)
  elif step == "eval":
    eval_net = model_lib.build(config.replace(deterministic=True))
    exported = _lowered(functools.partial(steps.eval_step, model=eval_net, label_smoothing=0.1), state.params, batch)
  else:
    fn = functools.partial(predict_lib.predict, model_config=config, max_decode_len=8, method=step, beam_size=2)
    exported = _lowered(fn, state.params, inputs)
  assert exported.platforms == PLATFORMS
  text = exported.mlir_module()
  assert "stablehlo" in text
  if step in ("greedy", "beam"):
    assert "stablehlo.while" in text  # the decoding loop is in the module, not unrolled on the host
  if dtype == "bfloat16":
    assert "bf16" in text  # the activations are computed in bfloat16


def test_a_custom_call_without_a_cross_platform_target_is_refused():
  # The check the test above relies on: a custom call that is not one of jax.export's stable targets (here a
  # made-up CPU kernel) does not export, so a step that used one would fail there.
  kernel = lambda x: jax.ffi.ffi_call("rpr_cpu_only_kernel", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
  with pytest.raises(ValueError, match="custom calls whose targets have no compatibility guarantees"):
    export.export(jax.jit(kernel), platforms=PLATFORMS)(jax.ShapeDtypeStruct((4,), jnp.float32))
