"""Test set-up: with no CUDA device, Triton kernels run under the interpreter (slow but exact).

At its end every session writes its record, ``runs/last-test.json`` (or the path ``MAHIA_TEST_RECORD``
names; ``mahia.measure.testrecord``): the count of each outcome, wall seconds, date, machine, arguments,
and ``full`` when the whole default suite ran to its end. A record that cannot be written costs one
warning line, never the run. After a full ``make test``, ``python -m mahia readme --write --test-record
runs/last-test.json`` puts it in the README.
"""

import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _cuda = False

if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported


@pytest.fixture
def bare_notebook_dir(tmp_path, monkeypatch) -> Path:
    """The runner's notebook folder replaced by one notebook, ``01_bare``, without a parameters cell: the
    runner reports it at once (failed) and starts no kernel, so a test of the runner's own files is quick."""
    import nbformat

    from mahia import runner

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, nbdir / "01_bare.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbdir)
    return nbdir


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _cuda:
            item.add_marker(skip_gpu)


# --- the record of the session -------------------------------------------------------------------------

_STARTED = pytest.StashKey[tuple]()  # (perf_counter, UTC datetime, session)


def pytest_sessionstart(session):
    session.config.stash[_STARTED] = (time.perf_counter(), datetime.now(timezone.utc), session)


def _ini_default(addopts: list[str], short: str) -> str:
    """The value of option ``short`` (``-m``, ``-k``) that the ini file's addopts give, '' if none."""
    value = ""
    for i, a in enumerate(addopts):
        if a == short and i + 1 < len(addopts):
            value = addopts[i + 1]
        elif a.startswith(short) and len(a) > 2:
            value = a[2:]
    return value


def _default_paths(config) -> set[Path]:
    """What ``pytest`` with no arguments collects: the ini's testpaths (globbed), else the rootdir."""
    paths = set()
    for p in config.getini("testpaths"):
        if any(c in p for c in "*?["):
            paths.update(q.resolve() for q in config.rootpath.glob(p))
        else:
            paths.add((config.rootpath / p).resolve())
    return paths or {config.rootpath.resolve()}


def _not_full(config, session, exitstatus, deselected: int) -> list[str]:
    """Why this session was not the whole default suite run to its end; empty when it was."""
    opt = config.option
    why = []
    given = {(config.invocation_params.dir / a).resolve() for a in config.args}
    if given != _default_paths(config):
        why.append(f"selected {' '.join(config.args)}")
    addopts = list(config.getini("addopts"))
    for short, name in (("-k", "keyword"), ("-m", "markexpr")):
        value = getattr(opt, name, "") or ""
        if value != _ini_default(addopts, short):
            why.append(f"{short} {value!r}")
    for name, flag in (
        ("deselect", "--deselect"),
        ("ignore", "--ignore"),
        ("ignore_glob", "--ignore-glob"),
        ("lf", "--last-failed"),
        ("stepwise", "--stepwise"),
        ("collectonly", "--collect-only"),
    ):
        if getattr(opt, name, None):
            why.append(f"{flag} given")
    if deselected and not (_ini_default(addopts, "-k") or _ini_default(addopts, "-m")):
        why.append(f"{deselected} deselected")
    stop = session.shouldfail or session.shouldstop
    if stop:
        why.append(f"stopped early ({stop})")
    if int(exitstatus) not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        why.append(f"exit status {int(exitstatus)} ({pytest.ExitCode(int(exitstatus)).name})")
    return why


def _write_record(terminalreporter, exitstatus, config) -> None:
    from mahia.measure import testrecord
    from mahia.measure.files import describe_commit

    t0, started, session = config.stash[_STARTED]
    seconds = time.perf_counter() - t0
    stats = {k: len(v) for k, v in terminalreporter.stats.items() if k}
    gpu = torch.cuda.get_device_name(0) if _cuda else None
    record = testrecord.build_record(
        stats=stats,
        seconds=seconds,
        started=started,
        args=list(config.invocation_params.args),
        not_full=_not_full(config, session, exitstatus, stats.get("deselected", 0)),
        exit_status=int(exitstatus),
        machine=testrecord.machine(cuda=_cuda, gpu=gpu),
        commit=describe_commit(),
        addopts_env=os.environ.get("PYTEST_ADDOPTS"),
    )
    path = testrecord.write_record(record, testrecord.last_record_path())
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    if record["full"] and not (record["counts"]["failed"] or record["counts"]["errors"]):
        terminalreporter.write_line(f"test record: {path} (a full run; into the README: {testrecord.REFRESH})")
    else:
        terminalreporter.write_line(f"test record: {path}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    try:
        _write_record(terminalreporter, exitstatus, config)
    except Exception as e:  # the record is a by-product: never fail or stop the run for it
        print(f"warning: no test record written ({type(e).__name__}: {e})", file=sys.stderr)
