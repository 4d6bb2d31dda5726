"""rpr/data/fetch.py against local fakes of the registry clients (``clients`` in conftest.py) and an HTTP
server on localhost standing in for the npm registry: no network is used.
"""

import hashlib
import http.server
import json
import os
import re
import threading

import pytest

from rpr import data
from rpr.data import fetch
from tests.conftest import PAYLOAD

WHEEL = fetch.Artefact("pypi", "somepkg", "1.2.3", "somepkg-1.2.3-py3-none-any.whl",
                       "0" * 64, megabytes=1)  # a made-up pin
TARBALL = fetch.Artefact("npm", "@scope/some-data", "0.1.0", "scope-some-data-0.1.0.tgz", "0" * 64,
                         megabytes=1)
SHA = hashlib.sha256(PAYLOAD).hexdigest()

@pytest.mark.parametrize("artefact", [WHEEL, TARBALL], ids=["pip", "npm"])
def test_a_missing_file_is_fetched_once_with_the_registry_client_and_checked(tmp_path, clients, capfd, artefact):
  cache = tmp_path / "cache"
  path = fetch.fetch(artefact, str(cache), SHA)
  assert path == str(cache / artefact.filename) and open(path, "rb").read() == PAYLOAD
  assert os.listdir(cache) == [artefact.filename]  # the temporary directory is gone
  command = clients.read_text()  # the client wrote into a temporary directory in the cache
  assert re.fullmatch({"pypi": r"pip download --no-deps somepkg==1\.2\.3 -d ", "npm": r"npm pack "
                       r"@scope/some-data@0\.1\.0 --pack-destination "}[artefact.registry]
                      + re.escape(str(cache)) + r"/\.fetch-\w+\n", command), command
  err = capfd.readouterr().err
  assert f"Fetching {artefact.spec} (1 MB) into {cache}" in err and f"Fetched {path}, SHA-256 checked" in err
  assert fetch.fetch(artefact, str(cache), SHA) == path  # cached: the client does not run again
  assert clients.read_text() == command


def test_a_fetched_file_with_another_hash_is_not_kept(tmp_path, clients):
  with pytest.raises(data.DataError) as e:
    fetch.fetch(WHEEL, str(tmp_path / "cache"))  # the pinned hash is not the fake payload's
  message = str(e.value)
  assert "\n" not in message and f"SHA-256 {SHA}, expected {WHEEL.sha256} (nothing was kept)" in message
  assert os.listdir(tmp_path / "cache") == []


def test_a_failing_client_is_one_line_naming_its_error_and_the_command_by_hand(tmp_path, clients, monkeypatch):
  monkeypatch.setenv("FAKE_FAIL", "1")
  with pytest.raises(data.DataError) as e:
    fetch.fetch(WHEEL, str(tmp_path / "cache"))
  message = str(e.value)
  assert "\n" not in message
  assert re.search(r"somepkg-1\.2\.3-py3-none-any\.whl is missing and could not be fetched: python3?[.\d]* -m pip "
                   r"exited with status 1: ERROR: No matching distribution found for somepkg==1\.2\.3; fetch it by "
                   r"hand with: pip download --no-deps somepkg==1\.2\.3 -d .*/cache$", message), message


def test_a_file_already_there_with_another_hash_is_refused_and_kept(tmp_path, clients):
  (tmp_path / WHEEL.filename).write_bytes(PAYLOAD)
  with pytest.raises(data.DataError, match=f"has SHA-256 {SHA}, expected {WHEEL.sha256}; delete it"):
    fetch.fetch(WHEEL, str(tmp_path))
  assert (tmp_path / WHEEL.filename).read_bytes() == PAYLOAD and clients.read_text() == ""


class _Registry(http.server.BaseHTTPRequestHandler):
  """Serves a version document whose ``dist.tarball`` points back at this server."""

  def do_GET(self):
    base = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"
    if self.path == "/@scope%2Fsome-data/0.1.0":
      body = json.dumps({"dist": {"tarball": f"{base}/@scope/some-data/-/some-data-0.1.0.tgz"}}).encode()
    elif self.path == "/@scope/some-data/-/some-data-0.1.0.tgz":
      body = PAYLOAD
    else:
      self.send_error(404)
      return
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


def test_without_npm_the_tarball_comes_over_http_from_the_registry(tmp_path, clients, monkeypatch, capfd):
  (tmp_path / "bin" / "npm").unlink()
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{server.server_address[1]}/")
    path = fetch.fetch(TARBALL, str(tmp_path / "cache"), SHA)
  finally:
    server.shutdown()
  assert open(path, "rb").read() == PAYLOAD and clients.read_text() == ""
  err = capfd.readouterr().err
  assert "with HTTP from the npm registry" in err and re.search(r"\n  0\.0 of 0\.0 MB\n", err), err


def test_without_npm_or_network_the_error_is_one_line(tmp_path, clients, monkeypatch):
  (tmp_path / "bin" / "npm").unlink()
  monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")  # the discard port: nothing listens
  with pytest.raises(data.DataError) as e:
    fetch.fetch(TARBALL, str(tmp_path / "cache"))
  message = str(e.value)
  assert "\n" not in message and "npm is not on PATH and the registry did not serve it" in message
  assert message.endswith(f"npm pack @scope/some-data@0.1.0 --pack-destination {tmp_path / 'cache'}")
