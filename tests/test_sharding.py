"""rpr.sharding on 4 forced CPU devices (a subprocess: the device count is fixed when JAX starts); the
2-process placement is tests/test_multiprocess.py's."""

import os
import subprocess
import sys

from tests.test_train import ROOT

SCRIPT = """
import jax, numpy as np
from rpr import sharding
from rpr.data import synthetic

mesh = sharding.make_mesh()
assert mesh.size == 4
devices = list(mesh.devices)
# Which rows which devices hold: one contiguous range per set of neighbours, an error otherwise.
assert sharding.host_rows(mesh, 8) == slice(0, 8)
assert sharding.host_rows(mesh, 8, devices[2:]) == slice(4, 8)
assert sharding.host_rows(mesh, 12, devices[1:2]) == slice(3, 6)
try:
  sharding.host_rows(mesh, 8, [devices[0], devices[2]])
  raise SystemExit("a gap was accepted")
except ValueError as e:
  assert "not one contiguous range" in str(e), e

class Rows:  # a task whose batches have 6 rows: padded to 8, two all-PAD rows
  def __init__(self, n):
    self.task, self.n, self.asked = synthetic.SequenceTask("copy", n, 1, 5, 6, 8, 8, seed=1), n, []
  def train_rows(self, step):
    return self.n
  def train_batch(self, step, rows=slice(None)):
    self.asked.append(rows)
    return self.task.train_batch(step, rows)

for n in (6, 8):
  task = Rows(n)
  got = sharding.host_batch(task, 3, mesh)
  want = sharding.shard_batch(sharding.pad_rows(task.task.train_batch(3), 4), mesh)
  assert task.asked == [slice(0, n)], task.asked
  for k in want:
    assert got[k].shape == want[k].shape == (8, want[k].shape[1]), (k, got[k].shape)
    assert got[k].sharding == want[k].sharding
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
    assert not np.asarray(got[k])[n:].any()  # PAD rows
print("ok")
"""


def test_host_rows_and_host_batch_on_4_devices():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, **env})
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
