"""rpr.provenance: the commit a run's code came from, recorded beside its config."""

import subprocess

from rpr import provenance


def test_the_code_version_is_the_checkouts_commit_and_says_when_the_code_differs_from_it(tmp_path):
  assert provenance.code_version(str(tmp_path)) is None  # not a git checkout
  git = lambda *args: subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                                     check=True, capture_output=True, text=True).stdout.strip()
  git("init", "-q")
  (tmp_path / "rpr").mkdir()
  (tmp_path / "rpr" / "model.py").write_text("x = 1\n")
  (tmp_path / "notes.md").write_text("a\n")
  git("add", ".")
  git("commit", "-q", "-m", "first")
  commit = git("rev-parse", "HEAD")
  assert provenance.code_version(str(tmp_path)) == commit
  (tmp_path / "notes.md").write_text("b\n")  # not code
  (tmp_path / "rpr" / "new.py").write_text("y = 2\n")  # untracked
  assert provenance.code_version(str(tmp_path)) == commit
  (tmp_path / "rpr" / "model.py").write_text("x = 2\n")
  assert provenance.code_version(str(tmp_path)) == commit + "+modified"
  assert provenance.code_version(str(tmp_path / "rpr")) is None  # inside a checkout, not its top


def test_the_cpu_is_named_with_its_widest_vector_extension(tmp_path):
  intel = tmp_path / "intel"
  intel.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse4_2 avx avx2 "
                   "avx512f\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n")
  assert provenance.cpu_model(str(intel)) == "Intel(R) Xeon(R) Processor (avx512f)"  # the first processor's
  amd = tmp_path / "amd"
  amd.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2\n")
  assert provenance.cpu_model(str(amd)) == "AMD EPYC (avx2)"
  arm = tmp_path / "arm"  # no model name: the platform's
  arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\n")
  assert provenance.cpu_model(str(arm)).endswith(" (asimd)")
  assert provenance.cpu_model(str(tmp_path / "absent")) != ""  # no cpuinfo: the platform's name, never empty
  assert provenance.environment()["cpu"] == provenance.cpu_model()
