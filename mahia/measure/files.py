"""Where results and figures are written, how, and which code made them.

``runs/results/<slug>/`` and ``runs/figures/<slug>/`` (git-ignored) take every run by default; ``data/results/
<slug>/`` and ``figures/<slug>/``, the committed reference, are written only by ``python -m mahia reference``.
Both are relative to the checkout (an installed package uses the cwd). A record carries ``run_commit()``:
``MAHIA_COMMIT`` (the runner's, one for a whole run), else the checkout's HEAD, ``-dirty`` when tracked files
under mahia/ or notebooks/ changed, ``unknown`` without git. This module imports nothing else of mahia.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
UNKNOWN = "unknown"
# Set to 1 by ``python -m mahia reference`` for the processes it starts: the one permission to write the
# committed reference folders.
REFERENCE_ENV = "MAHIA_REFERENCE"


def _base() -> Path:
    """The checkout when the package runs from one (results live beside it), else the current folder."""
    return REPO_ROOT if (REPO_ROOT / "notebooks").is_dir() and (REPO_ROOT / "mahia").is_dir() else Path.cwd()


def runs_dir() -> Path:
    """``runs/``: git-ignored; each runner run's folder, and the default results and figures roots."""
    return _base() / "runs"


def default_results_dir() -> Path:
    """Results root of every run that is not the reference: ``MAHIA_RESULTS_DIR`` or ``runs/results``."""
    env = os.environ.get("MAHIA_RESULTS_DIR")
    return Path(env) if env else runs_dir() / "results"


def default_figures_dir() -> Path:
    """Figures root of every run that is not the reference: ``MAHIA_FIGURES_DIR`` or ``runs/figures``."""
    env = os.environ.get("MAHIA_FIGURES_DIR")
    return Path(env) if env else runs_dir() / "figures"


def reference_results_dir() -> Path:
    """``data/results``: the committed reference records (one folder per GPU)."""
    return _base() / "data" / "results"


def reference_figures_dir() -> Path:
    """``figures``: the committed reference figures (one folder per GPU)."""
    return _base() / "figures"


def is_reference(path: str | Path) -> bool:
    """True when ``path`` is inside the committed reference folders (data/results or figures)."""
    roots = (reference_results_dir(), reference_figures_dir())
    return any(Path(path).resolve().is_relative_to(r.resolve()) for r in roots)


def check_writable(path: str | Path) -> None:
    """Refuse to write the committed reference unless ``python -m mahia reference`` said so."""
    if is_reference(path) and os.environ.get(REFERENCE_ENV) != "1":
        raise RuntimeError(
            f"{path} is the committed reference, written only by `python -m mahia reference` (on a GPU, "
            "from a clean tree); everything else writes to runs/results and runs/figures (git-ignored). "
            f"To write it by hand anyway, set {REFERENCE_ENV}=1."
        )


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def profile_file(folder: str | Path, stem: str, profile: str) -> Path:
    """``<stem>.json`` for the full profile (the reference's), ``<stem>-<profile>.json`` for any other:
    a quick run never touches the full profile's summary or ceilings."""
    return Path(folder) / (f"{stem}.json" if profile == "full" else f"{stem}-{profile}.json")


def _git(root: Path, *args: str) -> str | None:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")  # never take the index lock of a tree others work in
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False, env=env
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def describe_commit(root: str | Path = REPO_ROOT) -> str:
    """The short sha of ``root``'s HEAD, ``-dirty`` when tracked files under mahia/ or notebooks/ have
    uncommitted changes; ``unknown`` when ``root`` is no git checkout or git is missing or slow."""
    root = Path(root)
    if not (root / ".git").exists():  # an installed copy: never describe whatever repository surrounds it
        return UNKNOWN
    sha = _git(root, "rev-parse", "--short=12", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "mahia", "notebooks")
    if not sha or not sha.strip() or status is None:
        return UNKNOWN
    return sha.strip() + ("-dirty" if status.strip() else "")


@cache
def git_commit() -> str:
    """:func:`describe_commit` of this checkout, asked once per process."""
    return describe_commit(REPO_ROOT)


def run_commit() -> str:
    """The commit stamped on records: ``MAHIA_COMMIT`` (set by the runner for a whole run), else git's."""
    return os.environ.get("MAHIA_COMMIT") or git_commit()
