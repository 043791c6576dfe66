"""Notebooks 00 and 09 run in a real JupyterLab (over a temporary git copy of notebooks/; CPU, quick, interactive)
through Chromium's Run menu: no error output; autosave leaves ``git status`` clean (``make lab``'s save hook);
listings left-aligned and unwrapped; moving the explorer's slider shows "running: ...", then the new settings."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from browser import chromium, needs_chromium

from mahia.runner import notebook_parameters

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ["00_environment_and_roofline", "09_hybrid_components"]
SIDE_BY_SIDE = {"00_environment_and_roofline"}  # the notebooks with a before/after listing
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen (others are hidden tabs)
AUTOSAVE_S = 2

# One pytest worker runs the whole module (make test runs two): the JupyterLab server is started once.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.notebooks,
    pytest.mark.timeout(1200),
    pytest.mark.xdist_group("lab"),
    needs_chromium,
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare(nbdir: Path) -> None:
    """Set each notebook's parameters as a reader of this test would: on the CPU, quick, interactive."""
    for name in NOTEBOOKS:
        path = nbdir / f"{name}.ipynb"
        declared = notebook_parameters(path)
        nb = nbformat.read(path, as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        wanted = {"device": '"cpu"', "profile": '"quick"', "interactive": "True"}
        cell.source += "\n" + "".join(f"{k} = {v}\n" for k, v in wanted.items() if k in declared)
        nbformat.write(nb, path)


class Lab:
    """A JupyterLab server of its own: a free port, a token, every Jupyter folder in a temporary one."""

    def __init__(self, tmp: Path, root_dir: Path) -> None:
        self.root, self.port, self.token = root_dir, _free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        settings = tmp / "lab-settings"
        for plugin, value in (  # no news toast over the notebook; autosave soon after a run
            ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
            ("docmanager-extension/plugin", {"autosaveInterval": AUTOSAVE_S}),
        ):
            (path := settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings").parent.mkdir(parents=True)
            path.write_text(json.dumps(value))
        env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MAHIA_HEADLESS")}
        env.update(MAHIA_RESULTS_DIR=str(tmp / "results"), MAHIA_FIGURES_DIR=str(tmp / "figures"),
                   JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(settings),
                   JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"))  # fmt: skip
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={root_dir}",
               "--ContentsManager.pre_save_hook=mahia.runner.strip_on_save"]  # fmt: skip
        cmd += ["--allow-root"] if os.geteuid() == 0 else []  # as `make lab` does
        self.log = tmp / "lab.log"
        self.proc = subprocess.Popen(
            cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                self.api("status")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"JupyterLab did not start: {self.log.read_text()[-3000:]}") from None
                time.sleep(0.5)

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            f"{self.base}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def kernel(self, name: str) -> dict | None:
        """The kernel of the session of notebook ``name`` (id, execution_state), None before it starts."""
        for s in self.api("sessions"):
            if s["path"].endswith(f"{name}.ipynb") and s.get("kernel"):
                return s["kernel"] | {"session": s["id"]}
        return None

    def url(self, name: str) -> str:
        return f"{self.base}/lab/tree/{name}.ipynb?reset&token={self.token}"  # reset: a fresh workspace

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _wait(what: str, check, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _prompts(page) -> list[str]:
    return page.eval_on_selector_all(f"{PANEL} .jp-CodeCell .jp-InputArea-prompt", "els => els.map(e => e.textContent)")


def _run_all(page, lab: Lab, name: str) -> None:
    """Run every cell through the Run menu; wait until the kernel is idle and every code cell has run."""
    _wait(f"{name}'s kernel", lambda: (lab.kernel(name) or {}).get("execution_state") == "idle", 180)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    quiet = []

    def done() -> bool:  # idle on 3 polls in a row, and no cell waiting ('[*]') or left out ('[ ]')
        idle = lab.kernel(name)["execution_state"] == "idle"
        quiet.append(idle)
        prompts = _prompts(page)
        finished = prompts and all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts)
        return idle and all(quiet[-3:]) and len(quiet) >= 3 and finished

    try:
        _wait(f"{name} to run", done, 900, every=1.0)
    except AssertionError:
        left = [p for p in _prompts(page) if not re.fullmatch(r"\[\d+\]:", p.strip())]
        raise AssertionError(
            f"{name}: not every cell ran ({len(left)} prompts {sorted(set(left))}); {_errors(page)}"
        ) from None


def _errors(page) -> list[str]:
    texts = page.eval_on_selector_all(
        f'{PANEL} .jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]', "els => els.map(e => e.innerText)"
    )
    return [t[-1500:] for t in texts if "Traceback" in t]  # an error output, or a traceback printed to stderr


# Record every text the explorers' settings lines take (a MutationObserver sees each update, painted or not).
RECORD_LINES = """panel => {
  window.mahiaLines = [];
  const root = document.querySelector(panel);
  new MutationObserver(() => {
    for (const e of root.querySelectorAll('.widget-html')) {
      const t = e.innerText.trim();
      if (t.includes('=') && window.mahiaLines[window.mahiaLines.length - 1] !== t) window.mahiaLines.push(t);
    }
  }).observe(root, {subtree: true, childList: true, characterData: true});
}"""


def _settings_line(page) -> str:
    lines = page.eval_on_selector_all(f"{PANEL} .widget-html", "els => els.map(e => e.innerText.trim())")
    found = [t for t in lines if "=" in t]
    assert found, f"no settings line above the explorer's output; widget HTML: {lines}"
    return found[0]


def _explorer_output(page) -> str:
    return page.locator(f"{PANEL} .widget-output").first.inner_text()


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A git repository of the prepared notebooks, committed, and a JupyterLab server over it as `make lab` runs it."""
    tmp = tmp_path_factory.mktemp("lab")
    repo, nbdir = tmp / "repo", tmp / "repo" / "notebooks"
    shutil.copytree(ROOT / "notebooks", nbdir)
    shutil.copy(ROOT / ".gitignore", repo)
    _prepare(nbdir)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "notebooks")
    server = Lab(tmp, nbdir)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(lab, tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile"), viewport={"width": 1400, "height": 1000}) as context:
        yield context.new_page()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_jupyterlab_with_working_widgets(lab, page, name):
    started = time.time()
    page.goto(lab.url(name))
    page.wait_for_selector(f"{PANEL} .jp-Cell", timeout=120_000)
    _run_all(page, lab, name)
    errors = _errors(page)
    assert not errors, f"{name}: error output(s):\n" + "\n---\n".join(errors)
    outputs = page.eval_on_selector_all(f"{PANEL} .jp-OutputArea", "els => els.map(e => e.innerText).join('\\n')")
    for bad in ("IntSlider(", "Error displaying widget", "explorer skipped"):
        assert bad not in outputs, f"{name}: {bad!r} in an output: the explorer did not render"

    # show_source's listings (HTML outputs): left-aligned, unwrapped, whatever JupyterLab's CSS says.
    style = "els => els.map(e => { const s = getComputedStyle(e); return [s.whiteSpace, s.textAlign, s.wordBreak]; })"
    listings = page.eval_on_selector_all(f"{PANEL} .jp-OutputArea .jp-RenderedHTML pre", style)
    assert listings, f"{name}: no source listing"
    assert all(s == ["pre", "left", "normal"] for s in listings), f"{name}: listing styles {set(map(tuple, listings))}"
    sides = page.eval_on_selector_all(f"{PANEL} .jp-OutputArea .jp-RenderedHTML td:has(> pre)", style)
    assert sides or name not in SIDE_BY_SIDE, f"{name}: no side-by-side listing"
    assert all(s[1] == "left" for s in sides), f"{name}: side-by-side cells {set(map(tuple, sides))}"

    handle = page.locator(f"{PANEL} .widget-slider .noUi-handle").first
    assert handle.count(), f"{name}: no slider in the explorer"
    before_line, before_out = _settings_line(page), _explorer_output(page)
    assert not before_line.startswith("running"), before_line
    page.evaluate(RECORD_LINES, PANEL)  # every text the settings line takes from now on
    handle.focus()
    page.keyboard.press("ArrowRight")  # one step up

    def changed():
        line = _settings_line(page)
        return line if line != before_line and not line.startswith("running") else None

    after_line = _wait(f"{name}'s explorer to rerun", changed, 300, every=0.5)
    after_out = _wait(f"{name}'s explorer output to change", lambda: _explorer_output(page) != before_out, 60)
    assert after_out, f"{name}: moving the slider left the output as it was: {before_out!r}"
    assert not _errors(page), f"{name}: the explorer failed: {_errors(page)}"
    seen = page.evaluate("window.mahiaLines")
    assert any(t.startswith("running: ") and t.endswith(" ...") for t in seen), f"{name}: no running line in {seen}"
    assert seen[-1] == after_line, seen
    # Autosave has saved the notebook since the run began, and git sees no change.
    path = lab.root / f"{name}.ipynb"
    _wait(f"{name}'s autosave", lambda: path.stat().st_mtime > started, 10 * AUTOSAVE_S)
    status = _git(lab.root.parent, "status", "--porcelain")
    assert status == "", f"{name}: JupyterLab's save shows in git status:\n{_git(lab.root.parent, 'diff')[:3000]}"
    lab.api(f"sessions/{lab.kernel(name)['session']}", method="DELETE")  # the next notebook gets the CPU to itself
