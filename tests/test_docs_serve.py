"""`make docs-serve`: the built site over HTTP on 127.0.0.1 only (Sphinx's search shows page excerpts when served;
from disk it shows titles), named where a reader looks for the docs (the home page, the README)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> set[str]:
    """The addresses a TCP socket listens on at `port`, from /proc/net/tcp and tcp6."""
    found = set()
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                if size == 4:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the listening sockets from /proc (Linux)")
def test_make_docs_serve_serves_the_site_on_127_0_0_1_only(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>aspan</title><p>the home page</p>\n")
    (site / "searchindex.js").write_text('Search.setIndex({"docnames": ["index"]})\n')
    port = _free_port()
    server = subprocess.Popen(["make", "-s", "docs-serve", f"DOCS_SITE={site}", f"DOCS_PORT={port}",
                               f"DOCS_PY={sys.executable}"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _listening(port):
            assert server.poll() is None, server.stdout.read().decode()
            assert time.monotonic() < deadline, "make docs-serve did not listen within 60 s"
            time.sleep(0.2)
        assert _listening(port) == {"127.0.0.1"}  # this machine only: not 0.0.0.0, not ::
        for name in ("index.html", "searchindex.js"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{name}", timeout=30) as reply:
                assert reply.status == 200 and reply.read() == (site / name).read_bytes()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # make and the server it started (their own process group)
        server.wait(timeout=30)


def test_the_home_page_and_the_readme_name_docs_serve():
    dry = subprocess.run(["make", "-n", "docs-serve", "DOCS_SITE=."], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "-m http.server --bind 127.0.0.1 --directory ." in dry, dry
    for page in (ROOT / "docs" / "index.md", ROOT / "README.md"):
        assert "make docs-serve" in page.read_text(encoding="utf-8"), page
