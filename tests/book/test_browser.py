""""Open in Perfetto", clicked in headless Chromium on a built page.

The Perfetto UI is not reachable offline, so the page's script is pointed (through
``window.AP_PERFETTO_URL``, the same switch a self-hosted Perfetto would use) at a stand-in
served from another origin. The stand-in speaks Perfetto's side of the handshake: it
registers its message listener late, like a UI still loading, answers ``"PING"`` with
``"PONG"``, and sends whatever ``{perfetto: {...}}`` message arrives back to this test. The
test checks that the bytes delivered are exactly the published trace file's.

Chromium is driven over the DevTools protocol (tests/browser.py).
"""
from __future__ import annotations

import json
import queue
import ssl
import shutil
import subprocess
import time
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests.browser import DevTools, QuietFiles, find_or_install_chromium, open_page_at, serve
from tests.fake_book import FAKE_CHAPTER, build_fake_book, page_boxes

STAND_IN = """<!doctype html><title>Perfetto stand-in</title>
<script>
// Like the real UI: the listener exists only once the page has loaded (here, late), so the
// opener must keep pinging. The reply goes to "*", as Perfetto's does.
setTimeout(function () {
  window.addEventListener("message", function (event) {
    if (event.data === "PING") { event.source.postMessage("PONG", "*"); return; }
    var m = event.data && event.data.perfetto;
    if (!m) return;
    var about = "?title=" + encodeURIComponent(m.title) + "&fileName=" + encodeURIComponent(m.fileName || "")
      + "&arraybuffer=" + (m.buffer instanceof ArrayBuffer) + "&origin=" + encodeURIComponent(event.origin);
    fetch("/received" + about, {method: "POST", body: m.buffer});
  });
}, 400);
</script>"""


class StandIn(BaseHTTPRequestHandler):
    """Serves the stand-in page; records what it was posted in ``server.received``."""

    def do_GET(self):
        body = STAND_IN.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        about = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
        self.send_response(204)
        self.end_headers()
        self.server.received.put((about, data))

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = find_or_install_chromium()
    tools = DevTools(chromium, tmp_path_factory.mktemp("chromium-profile"))
    yield tools
    tools.close()


@pytest.fixture(scope="module")
def fake_book(tmp_path_factory):
    return build_fake_book(tmp_path_factory)


def open_page(browser: DevTools, url: str) -> str:
    """A fresh tab on ``url``, once the page's trace script has run; returns its session."""
    session = open_page_at(browser, url)
    deadline = time.monotonic() + 30
    while not browser.evaluate(session, "window.AP_TRACES_READY === true"):
        assert time.monotonic() < deadline, f"{url} never loaded perfetto.js; console: {browser.log}"
        time.sleep(0.1)
    return session


@pytest.mark.slow
def test_open_in_perfetto_delivers_the_exact_trace_bytes(browser, fake_book):
    book = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietFiles, directory=str(fake_book.html)))
    stand_in = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    stand_in.received = queue.Queue()
    book_url, stand_in_url = serve(book), serve(stand_in)
    try:
        page = f"book/{FAKE_CHAPTER}.html"
        boxes = page_boxes(fake_book.html, page).boxes
        session = open_page(browser, f"{book_url}/{page}")
        # Click the first box's button, as a reader would (a user gesture, so the pop-up opens).
        clicked = browser.evaluate(session, f"""(() => {{
            window.AP_PERFETTO_URL = {json.dumps(stand_in_url + "/")};
            const button = document.querySelector(".ap-trace a.ap-trace-perfetto");
            button.click();
            return button.closest(".ap-trace").dataset.traceUrl;
        }})()""", user_gesture=True)
        try:
            about, data = stand_in.received.get(timeout=30)
        except queue.Empty:
            pytest.fail(f"the stand-in never received a trace; page console: {browser.log}")
    finally:
        book.shutdown(), stand_in.shutdown()

    first = boxes[0]["box"]
    assert clicked == first["data-trace-url"]
    published = fake_book.html / "book" / first["data-trace-url"]
    assert data == published.read_bytes(), "Perfetto must receive the published file's exact bytes"
    assert data[:2] == b"\x1f\x8b", "posted as the gzip file it is"
    assert about == {"title": first["data-trace-title"], "fileName": "mm.json.gz",
                     "arraybuffer": "true", "origin": book_url}
    # the status line tells the reader it worked
    status = browser.evaluate(session, "document.querySelector('.ap-trace .ap-trace-status').textContent")
    assert status.startswith("Sent to Perfetto"), status


def https_server(directory: Path, tmp: Path) -> ThreadingHTTPServer:
    """A local HTTPS file server with a throwaway self-signed certificate (needs openssl)."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a certificate for the HTTPS check")
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietFiles, directory=str(directory)))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


@pytest.mark.slow
def test_url_deep_link_is_offered_over_https_only(browser, fake_book, tmp_path):
    count = "document.querySelectorAll('.ap-trace-url').length"
    plain = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietFiles, directory=str(fake_book.html)))
    secure = https_server(fake_book.html, tmp_path)
    try:
        session = open_page(browser, f"{serve(plain)}/book/{FAKE_CHAPTER}.html")
        assert browser.evaluate(session, count) == 0, "over plain http Perfetto could not fetch the file"
        origin = serve(secure).replace("http://", "https://")
        session = open_page(browser, f"{origin}/book/{FAKE_CHAPTER}.html")
        hrefs = browser.evaluate(session, "[...document.querySelectorAll('.ap-trace-url')].map(a => a.href)")
    finally:
        plain.shutdown(), secure.shutdown()
    boxes = page_boxes(fake_book.html, f"book/{FAKE_CHAPTER}.html").boxes
    assert hrefs == [f"https://ui.perfetto.dev/#!/?url={origin}/book/{b['box']['data-trace-url']}".replace("/book/../", "/")
                     for b in boxes]
