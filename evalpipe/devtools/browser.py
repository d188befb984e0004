"""A real headless browser for the viewer's tests, `make bench` and screenshots: Debian's chromium, driven
through chromedriver's W3C WebDriver HTTP API with urllib (no client library; the driver from the same
Debian source matches the browser's version exactly, and nothing is ever downloaded).

    python -m evalpipe.devtools.browser screenshot REPORT.html OUT.png [--fragment 'v=samples&...']

`make test` installs the two packages when it can (Debian, root); elsewhere `unavailable()` says why
and the browser tests skip with that reason.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference
# As docs/testing.md says: headless, as root (no sandbox), no background traffic on a closed network.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--mute-audio",
)


def executables() -> tuple[str | None, str | None]:
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


def unavailable() -> str | None:
    """Why no browser can be driven here (None when one can)."""
    chromium, driver = executables()
    if chromium is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None)
        return (
            f"{missing} not installed: `make test` installs Debian's chromium and chromium-driver when run as root "
            "on Debian (apt-get install chromium chromium-driver)"
        )
    return None


class WebDriverError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One chromium session. Use as a context manager, or call close()."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
        reason = unavailable()
        if reason:
            raise WebDriverError(reason)
        chromium, driver = executables()
        self.profile = tempfile.mkdtemp(prefix="evalpipe-chromium-")
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.driver = subprocess.Popen(
            [str(driver), f"--port={self.port}", "--allowed-ips=127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, with the browser it starts: close() ends them all
        )
        self.session: str | None = None
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if self._http("GET", "/status").get("ready"):
                        break
                except (OSError, WebDriverError):
                    pass
                if time.monotonic() > deadline or self.driver.poll() is not None:
                    raise WebDriverError("chromedriver did not start")
                time.sleep(0.05)
            options = {
                "binary": chromium,
                "args": [*FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}"],
            }
            value = self._http(
                "POST",
                "/session",
                {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}},
            )
            self.session = value["sessionId"]
        except BaseException:
            self.close()
            raise

    # ---- the wire

    def _http(self, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("value", {})
            except (ValueError, AttributeError):
                detail = {}
            raise WebDriverError(f"{method} {path}: {detail.get('error')}: {detail.get('message', '')[:500]}") from None
        return payload.get("value")

    def _cmd(self, method: str, path: str, body: Any = None) -> Any:
        return self._http(method, f"/session/{self.session}{path}", body)

    # ---- what tests use

    def open(self, path: Path, fragment: str = "") -> None:
        url = Path(path).resolve().as_uri() + (f"#{fragment}" if fragment else "")
        self._cmd("POST", "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """Run a function body in the page (`return ...` gives the value)."""
        return self._cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait(self, condition: str, timeout: float = 30.0, *args: Any) -> Any:
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(f"return ({condition});", *args)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout}s for {condition}")
            time.sleep(0.02)

    def idle(self, timeout: float = 30.0) -> None:
        """Wait until the viewer is ready and has no decoding, search or render in progress."""
        self.wait("window.__viewerReady === true && window.__viewerBusy === 0", timeout)

    def find(self, css: str) -> dict:
        return self._cmd("POST", "/element", {"using": "css selector", "value": css})

    def click(self, css: str) -> None:
        self._cmd("POST", f"/element/{self.find(css)[ELEMENT]}/click", {})

    def type(self, css: str, text: str) -> None:
        self._cmd("POST", f"/element/{self.find(css)[ELEMENT]}/value", {"text": text})

    def clear(self, css: str) -> None:
        self._cmd("POST", f"/element/{self.find(css)[ELEMENT]}/clear", {})

    def select(self, css: str, value: str) -> None:
        """Choose an option of a <select> by value, with a real click on the option."""
        option = self.run(
            "const s = document.querySelector(arguments[0]);"
            "const o = [...s.options].find(o => o.value === arguments[1]); return o ? 1 : 0;",
            css,
            value,
        )
        if not option:
            raise WebDriverError(f"no option {value!r} in {css}")
        self.click(css)
        found = self._cmd(
            "POST",
            f"/element/{self.find(css)[ELEMENT]}/elements",
            {"using": "css selector", "value": "option"},
        )
        for element in found:
            got = self._cmd("GET", f"/element/{element[ELEMENT]}/property/value")
            if got == value:
                self._cmd("POST", f"/element/{element[ELEMENT]}/click", {})
                return

    def screenshot(self, out: Path) -> Path:
        out = Path(out)
        out.write_bytes(base64.b64decode(self._cmd("GET", "/screenshot")))
        return out

    def close(self) -> None:
        if self.session is not None:
            try:
                self._http("DELETE", f"/session/{self.session}", timeout=30)
            except (OSError, WebDriverError):
                pass
            self.session = None
        if self.driver.poll() is None:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait()
        try:  # a browser the driver left behind (a page that never answered its quit): the group is ours alone
            os.killpg(self.driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalpipe.devtools.browser", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    shot = sub.add_parser("screenshot", help="open a report and save a PNG of what it shows")
    shot.add_argument("report", type=Path)
    shot.add_argument("out", type=Path)
    shot.add_argument("--fragment", default="", help="the URL fragment to open, e.g. 'v=samples&b=clbench'")
    shot.add_argument("--width", type=int, default=1280)
    shot.add_argument("--height", type=int, default=800)
    shot.add_argument("--open-details", action="store_true", help="expand the collapsed texts of the opened sample")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason:
        print(f"browser: {reason}", file=sys.stderr)
        return 2
    with Browser(args.width, args.height) as browser:
        browser.open(args.report, args.fragment)
        browser.idle()
        if args.open_details:
            browser.run("document.querySelectorAll('#detail details').forEach(d => { d.open = true; });")
            browser.idle()
        errors = browser.run("return window.__viewerErrors")
        browser.screenshot(args.out)
    print(f"browser: wrote {args.out}" + (f" (page errors: {errors})" if errors else ""), file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    os.umask(os.umask(0) | 0o002)
    sys.exit(main(sys.argv[1:]))
