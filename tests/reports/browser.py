"""A small headless-Chromium driver over the Chrome DevTools Protocol (for the browser test).

Starts the system `chromium` with a throw-away profile and `--remote-debugging-port=0`, reads the
chosen port from `DevToolsActivePort`, and talks to the page over a websocket. It records console
errors, uncaught exceptions and browser log errors (failed loads) from the moment of navigation.
Nothing is downloaded: the browser is Debian's package.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
    "--hide-scrollbars", "--mute-audio",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, exe: str, profile_dir: Path, width: int = 1440, height: int = 900,
                 timeout: float = 60.0) -> None:
        self.exe, self.profile_dir, self.timeout = exe, Path(profile_dir), timeout
        self.width, self.height = width, height
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws = None

    # --- life cycle ---------------------------------------------------------------------
    def __enter__(self) -> Browser:
        import websocket  # websocket-client, from the dev extra

        self.profile_dir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [self.exe, *FLAGS, f"--user-data-dir={self.profile_dir}", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port = self._wait_port()
        deadline = time.monotonic() + self.timeout
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not pages:
            raise RuntimeError("chromium started but shows no page target")
        self._ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"],
                                               timeout=self.timeout, suppress_origin=True)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ws is not None:
            self._ws.close()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)

    def _wait_port(self) -> int:
        marker = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self._proc.returncode} at start")
            if marker.is_file():
                text = marker.read_text().split()
                if text and text[0].isdigit():
                    return int(text[0])
            time.sleep(0.05)
        raise RuntimeError(f"chromium wrote no {marker} within {self.timeout:.0f} s")

    # --- protocol -----------------------------------------------------------------------
    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are recorded."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method} failed: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._on_event(msg)

    def _on_event(self, msg: dict[str, Any]) -> None:
        self._events.append(msg)
        method, params = msg["method"], msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in {"error", "assert"}:
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"uncaught: {text}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(
                f"log {entry.get('source')}: {entry.get('text')} {entry.get('url', '')}")

    def _wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for i, ev in enumerate(self._events):
                if ev["method"] == method:
                    return self._events.pop(i)
            msg = json.loads(self._ws.recv())
            if "method" in msg:
                self._on_event(msg)
        raise TimeoutError(f"no {method} within {self.timeout:.0f} s")

    # --- what the test uses ---------------------------------------------------------------
    def open(self, path: Path) -> None:
        """Load a local file and wait for its load event (console errors start counting here)."""
        self.errors.clear()
        self._events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        self._wait_event("Page.loadEventFired")
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))",
                      await_promise=True)

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=await_promise)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression[:60]!r}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def click(self, selector: str) -> None:
        """A real mouse click at the centre of the first element matching `selector`."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            w, h = self.evaluate("[document.documentElement.scrollWidth,"
                                 " document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})
        else:
            self.evaluate("window.scrollTo(0, 0)")
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
