""""Open in Perfetto", clicked in headless Chromium on a built page.

The Perfetto UI is not reachable offline, so the page's script is pointed (through
``window.AP_PERFETTO_URL``, the same switch a self-hosted Perfetto would use) at a stand-in
served from another origin. The stand-in speaks Perfetto's side of the handshake: it
registers its message listener late, like a UI still loading, answers ``"PING"`` with
``"PONG"``, and sends whatever ``{perfetto: {...}}`` message arrives back to this test. The
test checks that the bytes delivered are exactly the published trace file's.

Chromium is driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL bytes on file descriptors 3 and 4), so no Python package is
needed. Chromium itself is found on PATH, or installed with ``apt-get install -y chromium``
where the test runs as root; elsewhere the test is skipped with the command to run.
"""
from __future__ import annotations

import fcntl
import json
import os
import queue
import ssl
import shutil
import subprocess
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer, BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests.test_traces import FAKE_CHAPTER, build_fake_book, page_boxes

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL = "apt-get update && apt-get install -y chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync", "--remote-debugging-pipe",
                  "--ignore-certificate-errors"]  # for the HTTPS check's self-signed certificate


def find_or_install_chromium() -> str:
    """A Chromium executable; installs the Debian package where it can, else skips."""
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip(f"no Chromium on PATH and no way to install it here (needs root and apt-get): run `{INSTALL}`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"`{' '.join(cmd)}` failed, so Chromium is unavailable: {done.stderr.strip()[-300:]}")
    if not shutil.which("chromium"):
        pytest.skip("apt-get installed chromium but it is not on PATH")
    return shutil.which("chromium")


# ----------------------------------------------------------------------------------- servers

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


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(server: ThreadingHTTPServer) -> str:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


# ------------------------------------------------------------------------- DevTools via a pipe

class DevTools:
    """The smallest DevTools-protocol client: commands out on fd 3, replies and events in on fd 4."""

    def __init__(self, chromium: str, profile_dir: Path):
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Park the browser's ends above 9 so that moving them onto 3 and 4 cannot clobber either.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
        os.close(to_browser_r), os.close(from_browser_w)

        def child_fds():
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                                     preexec_fn=child_fds, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in high:
            os.close(fd)
        self.out, self.inbox, self.next_id, self.log = to_browser_w, queue.Queue(), 0, []
        threading.Thread(target=self._read, args=(from_browser_r,), daemon=True).start()

    def _read(self, fd):
        buffer = b""
        while chunk := os.read(fd, 65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for m in messages:
                self.inbox.put(json.loads(m))

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self.inbox.get(timeout=max(0.01, deadline - time.monotonic()))
            if reply.get("id") != self.next_id:
                self._note(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]

    def _note(self, event: dict):
        """Keep the page's console messages and exceptions, to explain a failure."""
        params = event.get("params", {})
        if event.get("method") == "Runtime.consoleAPICalled":
            self.log.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif event.get("method") == "Runtime.exceptionThrown":
            self.log.append(params.get("exceptionDetails", {}).get("exception", {}).get("description", "exception"))

    def evaluate(self, session: str, expression: str, user_gesture: bool = False):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": user_gesture}, session)
        return result["result"].get("value")

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:  # already gone: nothing to close
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self.out)


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
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    browser.send("Runtime.enable", session=session)
    browser.send("Page.navigate", {"url": url}, session)
    deadline = time.monotonic() + 30
    while not browser.evaluate(session, "document.readyState === 'complete' && window.AP_TRACES_READY === true"):
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
