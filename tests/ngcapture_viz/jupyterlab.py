"""Drive a real JupyterLab in headless Debian Chromium: start it, open a notebook, run it.

Shared by the browser tests, ``docs/make_screenshots.py`` and ``benchmarks/widget.py``.
JupyterLab listens on 127.0.0.1 only, with a token, its settings, workspaces and runtime files
in a scratch folder; it never checks for updates or news. Chromium is Debian's
(``/usr/bin/chromium``, ``make chromium``), started with a fresh profile; Playwright's own
browser builds are never used. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
CHROMIUM = Path(os.environ.get("NGCAPTURE_CHROMIUM", "/usr/bin/chromium"))


def require_browser(*servers: tuple[str, str]) -> None:
    """Skip the calling test module unless Playwright, Debian's Chromium and each
    ``(module, what provides it)`` server are installed (under ``NGCAPTURE_REQUIRE_ALL=1`` a
    module skipped so fails the run)."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    for module, provider in servers:
        pytest.importorskip(module, reason=f"{module} is not installed: {provider}")
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing: run `make chromium`", allow_module_level=True)


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT_S = 120


@dataclass
class Lab:
    """A running JupyterLab: its base URL, token and the folder it serves."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path
    app: str = "jupyterlab"

    def notebook_url(self, name: str) -> str:
        if self.app == "notebook":  # Notebook 7: one page per notebook
            return f"{self.url}/notebooks/{name}?token={self.token}"
        # ``reset``: a fresh workspace, not the tabs an earlier page left open.
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"


PORT_ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_lab(
    root: Path, *, disabled_extensions: Sequence[str] = (), app: str = "jupyterlab"
) -> Iterator[Lab]:
    """JupyterLab serving ``root/notebooks`` (the repo's notebooks and ``_setup.py`` copied).

    ``app="notebook"``: Notebook 7 (the classic Notebook today, built on JupyterLab) instead,
    with the same settings; its pages are ``/tree`` and ``/notebooks/<name>``.

    ``disabled_extensions``: what this server's ``labconfig/page_config.json`` disables, as if
    its environment had none of it: plugin ids or their prefix before ``:`` (plotly's
    renderer: ``@jupyterlab/plotly-extension``; the package name alone does not disable it).
    """
    work = root / "notebooks"
    work.mkdir(parents=True, exist_ok=True)
    for path in (*NOTEBOOK_DIR.glob("*.ipynb"), NOTEBOOK_DIR / "_setup.py"):
        shutil.copy2(path, work)
    settings = root / "settings"
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    # Every cell in the DOM (no virtual scrolling): the tests read all outputs.
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    notices = settings / "@jupyterlab" / "apputils-extension"
    notices.mkdir(parents=True)
    (notices / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    for name in ("scratch", "runtime", "config", "workspaces"):
        (root / name).mkdir(exist_ok=True)
    if disabled_extensions:
        labconfig = root / "config" / "labconfig"
        labconfig.mkdir(exist_ok=True)
        (labconfig / "page_config.json").write_text(
            json.dumps({"disabledExtensions": dict.fromkeys(disabled_extensions, True)})
        )
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "NGCAPTURE_REPO": str(REPO),
        "TMPDIR": str(root / "scratch"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
    }
    env.pop("NGCAPTURE_DEMO_DIR", None)
    log = root / "jupyterlab.log"
    name = "LabApp" if app == "jupyterlab" else "JupyterNotebookApp"
    command = [
        sys.executable,
        "-m",
        app,
        "--no-browser",
        "--allow-root",  # CI runs as root
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
        f"--{name}.expose_app_in_browser=True",
        f"--{name}.user_settings_dir={settings}",
        f"--{name}.workspaces_dir={root / 'workspaces'}",
    ]
    if app == "jupyterlab":
        command += [
            "--LabApp.check_for_updates_class="
            "jupyterlab.handlers.announcements.NeverCheckForUpdate",
            "--LabApp.news_url=",
            "--LabApp.extension_manager=readonly",
        ]
    lab = _start(command, env, log, token, work, app)
    try:
        yield lab
    finally:
        lab.process.terminate()
        try:
            lab.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.process.kill()
            lab.process.wait(timeout=20)


def _start(
    command: list[str], env: dict[str, str], log: Path, token: str, work: Path, app: str
) -> Lab:
    """Start the server on a free port; another process may take the port between our probe
    and the server's bind, so a server that exits saying so is started again on a new one."""
    for attempt in range(PORT_ATTEMPTS):
        port = _free_port()
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*command, f"--ServerApp.port={port}"], env=env, stdout=out, stderr=out
            )
        lab = Lab(f"http://127.0.0.1:{port}", token, work, process, log, app)
        try:
            _wait_until_up(lab)
        except RuntimeError:
            taken = process.poll() is not None and "already in use" in log.read_text()
            if not taken or attempt == PORT_ATTEMPTS - 1:
                process.kill()
                process.wait(timeout=20)
                raise
            continue
        return lab
    raise AssertionError("unreachable")


def _wait_until_up(lab: Lab) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited:\n{lab.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{lab.url}/api/status?token={lab.token}", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer in {START_TIMEOUT_S} s")


@dataclass
class Browser:
    """One Chromium with a fresh profile; pages record console errors and websocket bytes."""

    context: Any
    problems: list[str] = field(default_factory=list)
    ws_received: list[int] = field(default_factory=list)

    def page(self, *, width: int = 1400, height: int = 1000) -> Any:
        page = self.context.new_page()
        page.set_viewport_size({"width": width, "height": height})
        page.on("console", lambda m: m.type == "error" and self.problems.append(m.text))
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))

        def on_socket(ws: Any) -> None:
            ws.on("framereceived", lambda payload: self.ws_received.append(len(payload)))

        page.on("websocket", on_socket)
        return page


@contextlib.contextmanager
def chromium(*, offline_except: str | None = None) -> Iterator[Browser]:
    """Debian's Chromium via Playwright; requests to anything but ``offline_except`` (a URL
    prefix) and ``file://`` are refused."""
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="ngcapture-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        browser = Browser(context)
        allowed = ("file://", "data:", *([offline_except] if offline_except else []))

        def route(handle: Any) -> None:
            url = handle.request.url
            if url.startswith(allowed):
                handle.continue_()
            else:
                browser.problems.append(f"refused request: {url}")
                handle.abort()

        context.route("**/*", route)
        try:
            yield browser
        finally:
            context.close()


_OPEN = """async () => {
  const app = window.jupyterapp;
  await app.started; await app.restored;
  const panel = app.shell.currentWidget;
  await panel.context.ready; await panel.sessionContext.ready;
  return panel.context.path;
}"""

_OUTPUTS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return panel.content.model.toJSON().cells.filter(c => c.cell_type === 'code')
    .map(c => ({source: c.source, count: c.execution_count, outputs: c.outputs}));
}"""


def open_notebook(page: Any, lab: Lab, name: str, *, timeout_ms: int = 120_000) -> None:
    """Open ``name`` in JupyterLab and wait until its kernel is ready."""
    page.goto(lab.notebook_url(name), wait_until="domcontentloaded", timeout=timeout_ms)
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=timeout_ms)
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.context; }",
        timeout=timeout_ms,
    )
    page.evaluate(_OPEN)


def run_all(page: Any, *, timeout_ms: int = 300_000) -> list[dict[str, Any]]:
    """Run every cell (waits until the last finished); returns the code cells' JSON."""
    page.set_default_timeout(timeout_ms)
    page.evaluate("async () => await window.jupyterapp.commands.execute('notebook:run-all-cells')")
    wait_idle(page, timeout_ms=timeout_ms)
    outputs: list[dict[str, Any]] = page.evaluate(_OUTPUTS)
    return outputs


_IDLE = """() => { const w = window.jupyterapp.shell.currentWidget;
  const kernel = w && w.sessionContext.session && w.sessionContext.session.kernel;
  return kernel && kernel.status === 'idle'; }"""


def wait_idle(page: Any, *, timeout_ms: int = 120_000) -> None:
    """Wait until the current notebook's kernel is idle (the last run finished)."""
    page.evaluate("async () => { if (window.__ngcRun) { await window.__ngcRun; } }")
    page.wait_for_function(_IDLE, timeout=timeout_ms)


def run_cell(page: Any, index: int) -> None:
    """Make cell ``index`` active and start running it (does not wait)."""
    page.evaluate(
        "(i) => { const w = window.jupyterapp.shell.currentWidget;"
        " w.content.activeCellIndex = i;"
        " window.__ngcRun = window.jupyterapp.commands.execute('notebook:run-cell'); }",
        index,
    )


def save(page: Any) -> None:
    """Save the current notebook (outputs included)."""
    page.evaluate("async () => await window.jupyterapp.commands.execute('docmanager:save')")


def errors_in(cells: list[dict[str, Any]]) -> list[str]:
    """Error outputs of executed cells, as ``ename: evalue``."""
    return [
        f"{o.get('ename')}: {o.get('evalue')} (in {''.join(c['source'])[:60]!r})"
        for c in cells
        for o in c["outputs"]
        if o.get("output_type") == "error"
    ]
