"""The record of a test run, and the README's test block generated from the committed one.

Each pytest session (``tests/conftest.py``) writes ``runs/last-test.json`` (git-ignored; the path
``MAHIA_TEST_RECORD`` names another) through :func:`build_record` and :func:`write_record`: the count of
each outcome, the session's wall seconds, the date (UTC), the machine, the pytest arguments, and
``full``: whether the whole default suite ran to its end (``make test`` with no ``ARGS``).

``python -m mahia readme --write --test-record runs/last-test.json`` checks such a record
(:func:`check_publishable`: full, nothing failed), copies it to ``data/test-record.json``
(:func:`publish`) and renders the README's block between :data:`BEGIN` and :data:`END` from it
(:func:`render_block`, :func:`replace_block`); without a committed record the block says there is none.
So the README's test count and timing are never typed in, and ``tests/test_readme.py`` checks that the
committed block is what the committed record renders to.
"""

from __future__ import annotations

import json
import os
import platform
import textwrap
from datetime import datetime, timezone
from pathlib import Path

from mahia.measure.files import atomic_write_text, runs_dir

__all__ = [
    "BEGIN",
    "END",
    "COMMITTED",
    "OUTCOMES",
    "RECORD_ENV",
    "REFRESH",
    "RecordError",
    "last_record_path",
    "machine",
    "build_record",
    "write_record",
    "load_record",
    "check_publishable",
    "publish",
    "committed_record",
    "render_block",
    "replace_block",
    "format_duration",
]

BEGIN, END = "<!-- tests:begin -->", "<!-- tests:end -->"
COMMITTED = Path("data") / "test-record.json"  # relative to the checkout
RECORD_ENV = "MAHIA_TEST_RECORD"  # where a test session writes its record (default runs/last-test.json)
VERSION = 1
# pytest's names (its terminal summary's categories) -> the record's; every count is in each record.
OUTCOMES = {
    "passed": "passed",
    "failed": "failed",
    "skipped": "skipped",
    "error": "errors",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
    "deselected": "deselected",
    "warnings": "warnings",
}
WIDTH = 104  # the README's prose is wrapped near this
REFRESH = "python -m mahia readme --write --test-record runs/last-test.json"


class RecordError(ValueError):
    """A test record that is missing, malformed, or not one the README may show."""


def last_record_path() -> Path:
    """Where a test session writes its record: ``MAHIA_TEST_RECORD``, else ``runs/last-test.json``."""
    env = os.environ.get(RECORD_ENV)
    return Path(env) if env else runs_dir() / "last-test.json"


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def machine(*, cuda: bool, gpu: str | None = None) -> dict:
    """The machine a test session ran on: CPUs, platform, Python, torch and triton, and whether the tests
    used a CUDA GPU (``gpu``: its name) or the CPU, with the Triton kernels under the interpreter."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "cpu": _cpu_model(),
        "system": platform.system(),
        "arch": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "triton": _version("triton"),
        "pytest": _version("pytest"),
        "cuda": bool(cuda),
        "gpu": gpu if cuda else None,
        "triton_interpreter": os.environ.get("TRITON_INTERPRET") == "1",
    }


def build_record(
    *,
    stats: dict[str, int],
    seconds: float,
    started: datetime,
    args: list[str],
    not_full: list[str],
    exit_status: int,
    machine: dict,
    commit: str,
    addopts_env: str | None = None,
) -> dict:
    """One test session's record. ``stats``: pytest's count per category (``error``, not ``errors``; a
    plugin's own category, e.g. ``rerun``, is kept under its name); ``not_full``: why this was not the whole
    default suite run to its end (empty: it was)."""
    counts = {name: int(stats.get(key, 0)) for key, name in OUTCOMES.items()}
    counts.update({key: int(n) for key, n in stats.items() if key and key not in OUTCOMES and key not in counts})
    return {
        "version": VERSION,
        "date": started.astimezone(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(float(seconds), 2),
        "full": not not_full,
        "not_full": list(not_full),
        "exit_status": int(exit_status),
        "counts": counts,
        "args": [str(a) for a in args],
        "pytest_addopts_env": addopts_env,
        "commit": commit,
        "machine": machine,
    }


def write_record(record: dict, path: str | Path) -> Path:
    path = Path(path)
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def _check(record: object, where: str) -> dict:
    if not isinstance(record, dict):
        raise RecordError(f"{where} is not a test record (a JSON object)")
    fields = {
        "version": int,
        "date": str,
        "seconds": (int, float),
        "full": bool,
        "not_full": list,
        "counts": dict,
        "args": list,
        "commit": str,
        "machine": dict,
    }
    for key, kind in fields.items():
        if not isinstance(record.get(key), kind) or (kind is int and isinstance(record.get(key), bool)):
            raise RecordError(f"{where} is not a test record: no valid {key!r}")
    if record["version"] != VERSION:
        raise RecordError(f"{where} is a version {record['version']} test record; this code reads version {VERSION}")
    counts = record["counts"]
    for name in OUTCOMES.values():
        if not isinstance(counts.get(name), int) or isinstance(counts.get(name), bool) or counts[name] < 0:
            raise RecordError(f"{where} is not a test record: no valid count of {name!r}")
    try:
        datetime.fromisoformat(record["date"])
    except ValueError:
        raise RecordError(f"{where} is not a test record: date {record['date']!r} is not ISO 8601") from None
    m = record["machine"]
    if not isinstance(m.get("cuda"), bool) or not isinstance(m.get("cpus_usable") or m.get("cpus"), int):
        raise RecordError(f"{where} is not a test record: no valid machine (cpus, cuda)")
    return record


def load_record(path: str | Path) -> dict:
    """A test record read and checked; :class:`RecordError` (one line) when missing or malformed."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(f"no test record at {path} (`make test` writes runs/last-test.json)") from None
    except OSError as e:
        raise RecordError(f"cannot read the test record {path}: {e.strerror or e}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"{path} is not JSON: {e.msg}, line {e.lineno}") from None
    return _check(record, str(path))


def check_publishable(record: dict, where: str) -> None:
    """Refuse a record the README may not show: not the whole default suite, or with failures or errors."""
    if not record["full"]:
        why = "; ".join(record["not_full"]) or "not the whole default suite"
        raise RecordError(
            f"{where} is not a full run ({why}): the README shows only the whole default suite, `make test` "
            "with no ARGS"
        )
    bad = [f"{record['counts'][k]} {k}" for k in ("failed", "errors") if record["counts"][k]]
    if bad:
        raise RecordError(f"{where} has {' and '.join(bad)}: the README shows only a run where nothing failed")


def publish(source: str | Path, root: str | Path) -> dict:
    """Check the record at ``source`` and copy it to ``<root>/data/test-record.json``; the record."""
    record = load_record(source)
    check_publishable(record, str(source))
    write_record(record, Path(root) / COMMITTED)
    return record


def committed_record(root: str | Path) -> dict | None:
    """``<root>/data/test-record.json`` checked, or None when no record is committed yet."""
    path = Path(root) / COMMITTED
    if not path.exists():
        return None
    record = load_record(path)
    check_publishable(record, str(path))
    return record


def format_duration(seconds: float) -> str:
    """``48 s``, ``13 min 11 s``, ``1 h 02 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _machine_words(m: dict) -> str:
    cpus = m.get("cpus_usable") or m.get("cpus")
    kind = f"a {cpus}-core machine" if not m.get("cpu") else f"a {cpus}-core {m['cpu']} machine"
    soft = [" ".join(x for x in (m.get("system"), m.get("arch")) if x)]
    soft += [f"{name} {m[key]}" for key, name in (("python", "Python"), ("torch", "torch"), ("triton", "triton"))]
    soft = [s for s in soft if s and not s.endswith(" None")]
    if m["cuda"]:
        use = f"on the GPU, {m['gpu']}" if m.get("gpu") else "on a CUDA GPU"
    else:
        use = "a CPU run: no CUDA GPU" + (
            ", the Triton kernels under the interpreter" if m.get("triton_interpreter") else ""
        )
    return f"{kind} ({', '.join(soft)}; {use})"


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=WIDTH, break_long_words=False, break_on_hyphens=False) + "\n"


def render_block(record: dict | None, source: str = COMMITTED.as_posix()) -> str:
    """The README's test block (markers excluded) from a checked record, or saying there is none."""
    head = f"_generated from `{source}` by `python -m mahia readme --write`_\n\n"
    if record is None:
        return head + _wrap(
            f"No test record is committed yet (there is no `{source}`), so this README gives no test count or "
            f"timing. `make test` writes `runs/last-test.json` at its end; after a full run in which nothing "
            f"failed, `{REFRESH}` copies it to `{source}` and renders it here."
        )
    c = record["counts"]
    total = sum(c[k] for k in ("passed", "failed", "skipped", "errors", "xfailed", "xpassed"))
    outcomes = [f"{c[k]} {k}" for k in ("passed", "skipped", "xfailed", "xpassed") if c[k]]
    extra = f", {_plural(c['warnings'], 'warning')}" if c["warnings"] else ""
    day = datetime.fromisoformat(record["date"]).astimezone(timezone.utc).date().isoformat()
    return head + _wrap(
        f"The last full `make test` (the whole default suite, the kernel fuzz suite, every notebook in the "
        f"quick profile and the browser tests included) ran on {day} (UTC) at commit `{record['commit']}`: "
        f"**{total} tests, {', '.join(outcomes) or 'none run'}**{extra}, in {format_duration(record['seconds'])} "
        f"(pytest's wall time, after the lint step), on {_machine_words(record['machine'])}. To refresh this "
        f"after a full `make test`: `{REFRESH}`."
    )


def replace_block(text: str, block: str) -> str:
    """``text`` (the README) with the part between :data:`BEGIN` and :data:`END` replaced by ``block``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise RecordError(f"README.md needs one {BEGIN} ... {END} pair, in that order")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}{END}{tail}"
