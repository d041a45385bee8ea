"""Open a page in headless Chromium and say what it rendered and what it complained about.

Chromium is driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`: it reads
NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4), so no websocket
client, chromedriver or open port is needed. Every console error, uncaught exception and browser
log error (a resource that failed to load, say) is collected while the page loads and renders.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--remote-debugging-pipe",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageReport:
    values: dict[str, Any]  # each probe expression's value once all were truthy, or at the timeout
    errors: list[str] = field(default_factory=list)


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        return self.next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:  # fmt: skip
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._read(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read(deadline))
        except TimeoutError:
            pass


def _errors(events: list[dict[str, Any]]) -> list[str]:
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            found.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append(
                f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}"
            )
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}".strip())
    return found


def open_page(page: Path, probes: dict[str, str], timeout: float = 60.0) -> PageReport:
    """Load `page` (file://), evaluate each probe expression until all are truthy (or `timeout`),
    and return their values with every error the page logged."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install -y chromium)")
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()

    def wire() -> None:  # the child's fd 3 reads our commands, its fd 4 writes back
        # Copies first, so neither end is overwritten by the other's dup2; then made inheritable
        # (os.pipe's descriptors are closed on exec).
        ours, theirs = os.dup(to_child_r), os.dup(from_child_w)
        os.dup2(ours, 3)
        os.dup2(theirs, 4)
        os.set_inheritable(3, True)
        os.set_inheritable(4, True)

    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [browser, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire, close_fds=False,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        pipe = _Pipe(to_child_w, from_child_r)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
                "sessionId"
            ]
            for domain in ("Runtime", "Log", "Page"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            deadline = time.monotonic() + timeout
            values: dict[str, Any] = {}
            while time.monotonic() < deadline:
                for name, expression in probes.items():
                    reply = pipe.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                      session=session)  # fmt: skip
                    values[name] = reply.get("result", {}).get("value")
                if all(values.values()):
                    break
                time.sleep(0.2)
            pipe.drain(0.5)  # errors logged just after the charts appeared
            return PageReport(values, _errors(pipe.events))
        finally:
            try:
                pipe.send("Browser.close")
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            os.close(to_child_w)
            os.close(from_child_r)
