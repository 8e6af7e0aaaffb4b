"""One headless Chromium per test process, driven over its DevTools pipe; every page loads in a new tab.

Starting Chromium costs about 3 s of CPU on 2 cores, about half of what loading a report costs, and the
suite loads a dozen pages: one browser per pytest-xdist worker saves that start on every page but the
first.  The page runs much as ``chromium --headless --virtual-time-budget=N --dump-dom`` ran it: once it has
loaded, its timers fast-forward through N ms of virtual time, then the DOM is read.  Console messages and uncaught
exceptions are returned as lines, like the ``:CONSOLE`` lines Chromium prints with --enable-logging.

The DevTools protocol over a pipe (``--remote-debugging-pipe``): Chromium reads JSON commands on fd 3
and writes replies and events on fd 4, each message ended by a NUL byte.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# fds 3 and 4 of the child become Chromium's pipe ends (a tiny Python exec wrapper: /bin/sh only takes
# single-digit fd numbers in redirections, and preexec_fn is unsafe in a process with threads).
_EXEC_WITH_PIPE_FDS = (
    "import os,sys\n"
    "r,w=(os.dup(int(a)) for a in sys.argv[1:3])\n"  # out of 3/4's way first
    "os.dup2(r,3);os.dup2(w,4)\n"
    "os.set_inheritable(3,True);os.set_inheritable(4,True)\n"  # dup2(3,3) keeps dup's close-on-exec
    "os.execv(sys.argv[3],sys.argv[3:])\n")

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--remote-debugging-pipe")


PROFILE_PREFIX = "commdiag-test-chromium-"


class BrowserError(RuntimeError):
    pass


def _remove_stale_profiles() -> None:
    """Profiles of test processes that are gone (a killed xdist worker runs no atexit handler)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), PROFILE_PREFIX + "*-*")):
        pid = os.path.basename(path)[len(PROFILE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(path, ignore_errors=True)


class Browser:
    def __init__(self, exe: str):
        _remove_stale_profiles()
        self.profile = tempfile.mkdtemp(prefix=f"{PROFILE_PREFIX}{os.getpid()}-")
        cmd_r, cmd_w = os.pipe()
        resp_r, resp_w = os.pipe()
        argv = [sys.executable, "-c", _EXEC_WITH_PIPE_FDS, str(cmd_r), str(resp_w),
                os.path.realpath(exe), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        self.log = os.path.join(self.profile, "chromium.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, pass_fds=(cmd_r, resp_w), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
        os.close(cmd_r)
        os.close(resp_w)
        self._w, self._r = cmd_w, resp_r
        self._buf = b""
        self._next_id = 0
        self._events: list[dict] = []

    # -------------------------------------------------------------- protocol
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium closed its DevTools pipe (exit {self.proc.poll()}): "
                                       f"{self._log_tail()}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def wait_event(self, method: str, session: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for n, ev in enumerate(self._events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return self._events.pop(n)
            self._events.append(self._read_message(deadline))

    # -------------------------------------------------------------- pages
    def load(self, uri: str, budget_ms: int, timeout: float = 180.0) -> tuple[str, list[str]]:
        """(DOM after ``budget_ms`` of virtual time, console lines) of ``uri`` in a new tab of its own
        browser context (an incognito-like profile: no storage or cookie of an earlier page)."""
        context = self.call("Target.createBrowserContext")["browserContextId"]
        target = self.call("Target.createTarget", {"url": "about:blank",
                                                   "browserContextId": context})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable", session=session)
            self.call("Page.navigate", {"url": uri}, session)
            deadline = time.monotonic() + timeout
            while True:  # the page's own load event, not a late one of the tab's about:blank
                self.wait_event("Page.loadEventFired", session, max(0.0, deadline - time.monotonic()))
                here = self.call("Runtime.evaluate", {"expression": "location.href", "returnByValue": True},
                                 session)["result"].get("value")
                if here != "about:blank":
                    break
            # then the page's timers run ahead through the budget (a policy set before the navigation
            # would spend its budget before the new document exists)
            self.call("Emulation.setVirtualTimePolicy",
                      {"policy": "pauseIfNetworkFetchesPending", "budget": budget_ms}, session)
            self.wait_event("Emulation.virtualTimeBudgetExpired", session, timeout)
            dom = self.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                                 "returnByValue": True}, session)["result"]["value"]
            console = [line for ev in self._events if ev.get("sessionId") == session
                       for line in [_console_line(ev)] if line]
        finally:
            self._events = [ev for ev in self._events if ev.get("sessionId") != session]
            self.call("Target.closeTarget", {"targetId": target})
            self.call("Target.disposeBrowserContext", {"browserContextId": context})
        return dom, console

    def _log_tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


def _console_line(ev: dict) -> str | None:
    """A console message, an uncaught exception or a logged error, as one ``CONSOLE`` line."""
    method, p = ev.get("method"), ev.get("params", {})
    if method == "Runtime.consoleAPICalled":
        args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
        return f"CONSOLE({p.get('type')}): {args}"
    if method == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        return f"CONSOLE(exception): {d.get('text')} {d.get('exception', {}).get('description', '')}"
    if method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        e = p["entry"]
        return f"CONSOLE(log {e.get('source')}): {e.get('text')} {e.get('url', '')}"
    return None


_browser: Browser | None = None


def load(exe: str, uri: str, budget_ms: int) -> tuple[str, list[str]]:
    """Load ``uri`` in this process's browser (started on first use, restarted after a failure)."""
    global _browser
    if _browser is None or _browser.proc.poll() is not None:
        if _browser is not None:
            _browser.close()
        _browser = Browser(exe)
    try:
        return _browser.load(uri, budget_ms)
    except Exception:
        _browser.close()  # a browser in an unknown state serves no further page
        _browser = None
        raise


@atexit.register
def close() -> None:
    global _browser
    if _browser is not None:
        _browser.close()
        _browser = None
