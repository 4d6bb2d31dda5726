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
