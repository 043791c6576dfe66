"""A run's session: its folder, its commit, its environment, and each part's process (papermill, or a suite)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mahia.measure import files
from mahia.measure.files import REPO_ROOT
from mahia.runner.notebooks import UsageError, _running_cell

# Seconds a stopped part gets after SIGTERM (papermill then shuts its kernel down) before SIGKILL.
KILL_GRACE_S = 20.0


def new_run_dir(stem: str, base: Path | None = None) -> Path:
    """A new folder ``<base>/<stem>`` (``<stem>-2``, ``-3``... when taken): no run overwrites another's."""
    base = Path(base) if base is not None else files.runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        with contextlib.suppress(FileExistsError):
            (folder := base / (stem if i == 1 else f"{stem}-{i}")).mkdir()
            return folder


def _writable_dir(flag: str, path: str | Path) -> Path:
    """``path`` as a folder this process can write into, created if need be; else a UsageError naming ``flag``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        (probe := path / f".mahia-write-check-{uuid.uuid4().hex}").touch()
        probe.unlink()
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return path


class StopFlag:
    """Set by SIGINT or SIGTERM while a run's parts run: the running part is stopped and no later part starts.
    A second signal changes nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, _frame=None) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Catch SIGINT and SIGTERM for the block (main thread only), then restore the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def bytecode_cache(env: dict, folder: Path, package_file: str | None = None) -> str | None:
    """Give the notebooks' processes a bytecode cache (``PYTHONPYCACHEPREFIX=folder``) where Python keeps none
    (``PYTHONDONTWRITEBYTECODE`` set, or a read-only install without one: ``package_file``, default torch's,
    stands for the installed packages); returns why, or None. On the lent H100 (torch 2.11, Python 3.12)
    compiling torch's source again took 11 s of every notebook's import cell. A prefix the user set is kept."""
    if env.get("PYTHONPYCACHEPREFIX"):
        return None
    if env.get("PYTHONDONTWRITEBYTECODE"):
        why = "PYTHONDONTWRITEBYTECODE is set"
    else:
        if package_file is None:
            import torch

            package_file = torch.__file__
        cached = Path(importlib.util.cache_from_source(package_file))
        where = cached.parent if cached.parent.exists() else cached.parent.parent
        if cached.exists() or os.access(where, os.W_OK):
            return None
        why = f"{Path(package_file).parent} has no bytecode cache and is read-only"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(folder)
    return f"{why}: the notebooks keep their compiled bytecode in {folder} (PYTHONPYCACHEPREFIX)"


@dataclass
class _Session:
    """What every notebook and suite of one run shares."""

    dev: object
    slug: str
    profile: str
    run_id: str
    commit: str
    out_dir: Path
    res_root: Path
    fig_root: Path
    env: dict
    timeout: float
    seed: int
    stop: StopFlag = field(default_factory=StopFlag)
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def _session(dev, prof: str, *, out, res_root, fig_root, timeout, seed, label, commit=None, reference=False):
    from mahia.measure import hardware

    slug = hardware.device_slug(dev)
    run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    commit = commit or files.run_commit()  # once, at the start: the whole run carries this commit
    out_dir = (
        new_run_dir(f"{datetime.now():%Y-%m-%d-%H%M%S}-{slug}-{label}") if not out else _writable_dir("--out", out)
    )
    if out and (earlier := [n for n in ("outcomes.json", "report.md") if (out_dir / n).exists()]):
        # a command repeated as it was still runs: in a new folder beside the earlier run's
        out_dir = new_run_dir(out_dir.name, out_dir.parent)
        print(f"--out {out} holds an earlier run ({earlier[0]}): this run writes to {out_dir}")
    env = dict(
        os.environ,
        MAHIA_RUN_ID=run_id,
        MAHIA_COMMIT=commit,
        MAHIA_PROFILE=prof,
        MAHIA_HEADLESS="1",
        MAHIA_RESULTS_DIR=str(res_root),
        MAHIA_FIGURES_DIR=str(fig_root),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.pop("TRITON_INTERPRET", None)  # the test suite's interpreter must not leak into the notebooks' kernels
    if reference:
        env[files.REFERENCE_ENV] = "1"
    if cache := bytecode_cache(env, REPO_ROOT / "runs" / ".pycache"):
        print(f"note: {cache}", flush=True)
    return _Session(dev, slug, prof, run_id, commit, out_dir, res_root, fig_root, env, timeout, seed)


def _spawn(cmd: list[str], log: Path, sess: _Session, cwd: Path | None = None, mode: str = "w") -> int | None:
    """Run ``cmd``, output to ``log`` (``mode`` "a": after what is there); its exit code, or None when it was
    stopped (the ``--timeout`` limit, or a signal set ``sess.stop``): SIGTERM, on which papermill (nbclient) shuts
    its kernel down, then SIGKILL."""
    deadline = time.monotonic() + sess.timeout
    with open(log, mode) as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=sess.env, cwd=cwd)
        while sess.stop.signum is None and time.monotonic() < deadline:  # short waits: a handler only sets the flag
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = proc.wait(timeout=0.5)
                # A terminal's Ctrl-C and `timeout` signal the whole group: the child may die of the same signal
                # before this loop sees the flag. It was stopped, not failed.
                return None if rc != 0 and sess.stop.signum is not None else rc
        proc.terminate()
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return None


def _stopped(sess: _Session, out_nb: Path | None = None) -> dict:
    """Status, cell and error of a part that ``_spawn`` stopped."""
    cell = _running_cell(out_nb) if out_nb is not None else None
    if sess.stop.signum is not None:
        return {"status": "interrupted", "cell": cell, "error": f"stopped by {sess.stop.name}"}
    return {"status": "timeout", "cell": cell, "error": f"stopped after the {sess.timeout:.0f} s limit (--timeout)"}


def reference_commit(allow_dirty: bool = False) -> str:
    """The commit a reference run records: ``MAHIA_COMMIT`` when set (a lent machine's copy of the tree may
    carry another commit's ``.git``), else git's. Refuses a ``-dirty`` tree unless ``allow_dirty``."""
    given, git = os.environ.get("MAHIA_COMMIT"), files.git_commit()
    if given and git not in (files.UNKNOWN, given):
        print(f"commit {given} from MAHIA_COMMIT (git here says {git})", file=sys.stderr)
    commit = given or git
    if commit == files.UNKNOWN:
        raise UsageError(
            "cannot tell which commit this code is (no git checkout here): set MAHIA_COMMIT to "
            "the commit this tree is a copy of (`python -m mahia commit` prints it where git is)"
        )
    if commit.endswith("-dirty") and not allow_dirty:
        raise UsageError(
            f"the working tree has uncommitted changes under mahia/ or notebooks/ ({commit}): the "
            "reference must say which code made it; commit first (or pass --allow-dirty)"
        )
    return commit


def recorded_parts(folder: Path, commit: str) -> dict[str, dict]:
    """The parts (notebooks, ``bench_<suite>``) of a reference folder last finished at ``commit``."""
    from mahia.measure.report import reference_parts

    return {p["part"]: p for p in reference_parts(folder) if p.get("commit") == commit and p.get("status") == "ok"}


def _bench_suites(spec: str | None) -> list[str]:
    from mahia.bench import SUITES

    if spec in (None, "none"):
        return []
    names = sorted(SUITES) if spec == "all" else [n.strip() for n in spec.split(",")]
    bad = [n for n in names if n not in SUITES]
    if bad:
        raise UsageError(f"--bench {spec!r}: no suite {bad[0]!r}; choose from {', '.join(sorted(SUITES))}, all or none")
    return list(dict.fromkeys(names))
