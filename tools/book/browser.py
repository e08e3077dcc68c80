"""Headless Chromium driven over the DevTools protocol through a pipe
(``--remote-debugging-pipe``: JSON messages separated by NUL bytes on file descriptors 3 and
4), so no Python package is needed; and a quiet local file server to point it at.

The book's page measurements (``tools.book.pages``) and the browser tests (tests/browser.py,
which adds installing Chromium for a test run) share this one client.
"""
from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL = "apt-get update && apt-get install -y chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync", "--remote-debugging-pipe",
                  "--ignore-certificate-errors"]  # for the HTTPS check's self-signed certificate


def find_chromium() -> str | None:
    """A Chromium executable on PATH, or None."""
    return next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)


# ----------------------------------------------------------------------------------- servers

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
        os.close(to_browser_r)
        os.close(from_browser_w)

        def child_fds():
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                                     preexec_fn=child_fds, close_fds=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in high:
            os.close(fd)
        self.out, self.next_id = to_browser_w, 0
        self.inbox: queue.Queue[dict] = queue.Queue()
        self.log: list[str] = []
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


def open_page_at(tools: DevTools, url: str, width: int = 1280) -> str:
    """A fresh tab on ``url`` at ``width`` px, once the page and its images have loaded; its session."""
    target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    tools.send("Runtime.enable", session=session)
    tools.send("Page.enable", session=session)
    tools.send("Emulation.setDeviceMetricsOverride",
               {"width": width, "height": 1600, "deviceScaleFactor": 1, "mobile": False}, session)
    tools.send("Page.navigate", {"url": url}, session)
    deadline = time.monotonic() + 30
    while not tools.evaluate(session, "document.readyState === 'complete' && "
                                      "Array.from(document.images).every(i => i.complete)"):
        assert time.monotonic() < deadline, f"{url} did not finish loading"
        time.sleep(0.1)
    return session


def close_page(tools: DevTools, url: str) -> None:
    """Close the tabs showing ``url`` (every page at two widths would otherwise leave dozens open)."""
    for target in tools.send("Target.getTargets")["targetInfos"]:
        if target["type"] == "page" and target["url"].split("#")[0] == url:
            tools.send("Target.closeTarget", {"targetId": target["targetId"]})


@contextmanager
def served(html: Path, chromium: str, profile: Path):
    """The folder ``html`` served on loopback and a headless Chromium: ``(tools, base URL)``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietFiles, directory=str(html)))
    base = serve(server)
    tools = DevTools(chromium, profile)
    try:
        yield tools, base
    finally:
        tools.close()
        server.shutdown()
