"""A run's session: its processes (a part stopped with everything it started), its folder, its commit."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import signal
import subprocess
import sys
import tempfile
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

# Seconds a stopped part's processes get to exit after SIGTERM before SIGKILL.
KILL_GRACE_S = 10.0


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (Linux; elsewhere none are found and only the part's
    own process group is stopped)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])  # 'pid (comm) state ppid ...'
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_groups(groups: set[int], sig: int) -> None:
    for g in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, sig)


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # gone (or not Linux: the part's own wait covers it)
        if state not in ("Z", "X"):  # a zombie waits for its parent, it runs nothing
            return True
    return False


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and everything it started: its process group and the groups of its descendants (a
    Jupyter kernel runs in a session of its own): SIGTERM, then SIGKILL after ``KILL_GRACE_S``."""
    pids = [proc.pid] + _descendants(proc.pid)  # before any dies: an orphan loses its link to the part
    groups = {proc.pid}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            groups.add(os.getpgid(pid))
    groups.discard(os.getpgid(0))  # never the runner's own group
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or _alive(pids[1:])):
        time.sleep(0.1)
    if proc.poll() is None or _alive(pids[1:]):
        _signal_groups(groups, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def new_run_dir(stem: str, base: Path | None = None) -> Path:
    """A new folder ``<base>/<stem>`` (``<stem>-2``, ``-3``... when taken): no run overwrites another's."""
    base = Path(base) if base is not None else files.runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    for i in itertools.count(1):
        folder = base / (stem if i == 1 else f"{stem}-{i}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _writable_dir(flag: str, path: str | Path) -> Path:
    """``path`` as a folder this process can write into, created if need be; else a UsageError naming
    ``flag`` (a file, a read-only place, a parent that is a file), before anything runs."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".mahia-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return path


def _out_dir(out: str | None, stem: str) -> Path:
    if not out:
        return new_run_dir(stem)
    out_path = _writable_dir("--out", out)
    # Never over an earlier run: its report and executed notebooks would be mixed with this run's. A
    # folder beside it instead (<out>-2, ...), so that a command repeated as it was (a reference part
    # resumed on the same machine) still runs.
    earlier = [n for n in ("outcomes.json", "report.md") if (out_path / n).exists()]
    if not earlier:
        return out_path
    folder = new_run_dir(out_path.name, out_path.parent)
    print(f"--out {out} holds an earlier run ({earlier[0]}): this run writes to {folder}")
    return folder


class StopFlag:
    """Set by SIGINT or SIGTERM while a run's parts run (the signal handler): the running part is stopped
    and no later part starts. A second signal while the run stops and writes its report changes nothing."""

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
        """Catch SIGINT and SIGTERM for the life of the block (only the main thread can; elsewhere they
        keep their handlers), restoring the previous handlers after it."""
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
    """Give the notebooks' processes a bytecode cache where Python would keep none; say why, or None.

    Python caches compiled bytecode beside the source (``__pycache__``) unless ``PYTHONDONTWRITEBYTECODE``
    is set or that folder is read-only. Then every process compiles every module it imports again:
    on the lent H100 (torch 2.11, Python 3.12) that was 11 s of each notebook's import cell, about a
    fifth of a quick run. Setting ``PYTHONPYCACHEPREFIX`` (Python >= 3.8) keeps the cache in ``folder``
    instead, outside the source tree, which is what ``PYTHONDONTWRITEBYTECODE`` protects. Only the runner's
    child processes get it, and a prefix the user set is kept. ``package_file`` (default torch's
    ``__init__.py``) stands for the installed packages: a cache beside it, or a writable folder for
    one, means Python caches by itself."""
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
    return (
        f"{why}: the notebooks keep their compiled bytecode in {folder} (PYTHONPYCACHEPREFIX), so that "
        "each one does not compile the Python source of torch and the rest again"
    )


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
    stop: StopFlag
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def _session(
    dev,
    prof: str,
    *,
    out: str | None,
    res_root: Path,
    fig_root: Path,
    timeout: float,
    seed: int,
    label: str,
    commit: str | None = None,
    reference: bool = False,
) -> _Session:
    from mahia.measure import hardware

    slug = hardware.device_slug(dev)
    run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    commit = commit or files.run_commit()  # once, at the start: the whole run carries this commit
    out_dir = _out_dir(out, f"{datetime.now():%Y-%m-%d-%H%M%S}-{slug}-{label}")
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
    # A notebook runs what a user's session would: the test suite's Triton interpreter (set by
    # tests/conftest.py on CPU machines) must not leak into the kernels the runner starts.
    env.pop("TRITON_INTERPRET", None)
    cache = bytecode_cache(env, REPO_ROOT / "runs" / ".pycache")
    if cache:
        print(f"note: {cache}", flush=True)
    if reference:
        env[files.REFERENCE_ENV] = "1"
    return _Session(dev, slug, prof, run_id, commit, out_dir, res_root, fig_root, env, timeout, seed, StopFlag())


def _spawn(cmd: list[str], log: Path, sess: _Session, cwd: Path | None = None) -> int | None:
    """Run ``cmd`` in its own process group, output to ``log``; its exit code, or None when it was stopped:
    after the ``--timeout`` limit, or because a signal set ``sess.stop``."""
    deadline = time.monotonic() + sess.timeout
    with open(log, "w") as logf:
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=sess.env, cwd=cwd, start_new_session=True
        )
        # Short waits, not one: a signal handler only sets the flag, and a blocking wait would not look at it.
        while sess.stop.signum is None and time.monotonic() < deadline:
            try:
                return proc.wait(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                continue
        _kill_group(proc)
        return None


def _stopped(sess: _Session, out_nb: Path | None = None) -> dict:
    """Status, cell and error of a part that ``_spawn`` stopped."""
    cell = _running_cell(out_nb) if out_nb is not None else None
    if sess.stop.signum is not None:
        return {"status": "interrupted", "cell": cell, "error": f"stopped by {sess.stop.name}"}
    return {"status": "timeout", "cell": cell, "error": f"stopped after the {sess.timeout:.0f} s limit (--timeout)"}


# -- the committed reference ---------------------------------------------------------------------------
def reference_commit(allow_dirty: bool = False) -> str:
    """The commit a reference run records: ``MAHIA_COMMIT`` when set (a lent machine gets a copy of the
    working tree whose ``.git`` can be another commit's: whoever starts the run says which code it is,
    ``python -m mahia commit`` in the checkout prints it), else git's. Refuses a tree with uncommitted
    changes under mahia/ or notebooks/ (a commit ending in ``-dirty``) unless ``allow_dirty``."""
    given = os.environ.get("MAHIA_COMMIT")
    git = files.git_commit()
    if given:
        commit = given
        if git not in (files.UNKNOWN, given):
            print(f"commit {given} from MAHIA_COMMIT (git here says {git})", file=sys.stderr)
    elif git == files.UNKNOWN:
        raise UsageError(
            "cannot tell which commit this code is (no git checkout here): set MAHIA_COMMIT to "
            "the commit this tree is a copy of (`python -m mahia commit` prints it where git is)"
        )
    else:
        commit = git
    if commit.endswith("-dirty") and not allow_dirty:
        raise UsageError(
            f"the working tree has uncommitted changes under mahia/ or notebooks/ ({commit}): the "
            "reference must say which code made it; commit first (or pass --allow-dirty)"
        )
    return commit


def _part_file(folder: Path, name: str) -> Path:
    return folder / "parts" / f"{name}.json"


def recorded_parts(folder: Path, commit: str) -> dict[str, dict]:
    """The parts (notebooks, ``bench_<suite>``) of a reference folder last finished at ``commit``."""
    from mahia.measure.report import reference_parts

    return {p["part"]: p for p in reference_parts(folder) if p.get("commit") == commit and p.get("status") == "ok"}


def _bench_suites(spec: str | None) -> list[str]:
    from mahia.bench import SUITES

    if spec in (None, "none"):
        return []
    names = sorted(SUITES) if spec == "all" else [n.strip() for n in spec.split(",")]
    if not all(names):
        raise UsageError(f"--bench {spec!r} has an empty name; choose from {', '.join(sorted(SUITES))}, all or none")
    bad = [n for n in names if n not in SUITES]
    if bad:
        raise UsageError(f"--bench {', '.join(bad)}: no such suite; choose from {', '.join(sorted(SUITES))} or all")
    return list(dict.fromkeys(names))


def _set_aside_unfinished(sess: _Session, folder: Path, outcomes: list[dict]) -> None:
    """A notebook part that did not finish leaves the reference only what finished parts wrote: the rows its
    cells recorded before it stopped go to the run's folder (``<part>.unfinished.csv``). The kernel suite is
    left alone: it records each of its parts whole and resumes from them."""
    from mahia.measure.results import set_aside_run

    for o in outcomes:
        if o["status"] in ("ok", "skipped", "not run"):
            continue
        to = sess.out_dir / f"{o['name']}.unfinished.csv"
        n = set_aside_run(folder / f"{o['name']}.csv", sess.run_id, to)
        if n:
            print(
                f"  {o['name']}: {n} record(s) of this unfinished part moved out of the reference to {to}; "
                f"figures it drew before it stopped stay in {sess.fig_root / sess.slug} until it runs again"
            )
