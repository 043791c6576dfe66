"""The record each test session writes (tests/conftest.py), and the README's test block rendered from the
committed one (``python -m mahia readme``): counts, ``full``, the refusals, and no drift."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from mahia.__main__ import main
from mahia.measure import testrecord as tr

ROOT = Path(__file__).resolve().parent.parent

INNER_TESTS = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("set-up fails")

def test_pass_one():
    pass

def test_pass_two():
    pass

def test_fails():
    assert 1 == 2

@pytest.mark.skip(reason="skipped on purpose")
def test_skipped():
    pass

@pytest.mark.xfail(reason="fails on purpose")
def test_xfailed():
    assert 1 == 2

def test_error(broken):
    pass

@pytest.mark.slow
def test_slow_not_in_the_default_run():
    pass
"""


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    """A small project that uses a copy of this suite's conftest: testpaths t, and a default -m in addopts."""
    root = tmp_path_factory.mktemp("inner")
    shutil.copy(ROOT / "tests" / "conftest.py", root / "conftest.py")
    (root / "pytest.ini").write_text(
        '[pytest]\ntestpaths = t\naddopts = -ra -m "not slow"\nmarkers =\n    slow: left out by default\n'
    )
    (root / "t").mkdir()
    (root / "t" / "test_mix.py").write_text(INNER_TESTS)
    return root


def run_inner(root: Path, *args: str, record: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    record = record or root / "records" / f"rec-{abs(hash(args))}.json"
    if record.exists():
        record.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(CUDA_VISIBLE_DEVICES="", **{tr.RECORD_ENV: str(record)})
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    return r, record


def test_a_session_writes_its_record_the_whole_default_suite_is_full(inner):
    before = datetime.now(timezone.utc)
    r, path = run_inner(inner)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"test record: {path.relative_to(inner)}" in r.stdout  # relative to where pytest ran
    assert "warning" not in r.stderr
    rec = tr.load_record(path)
    assert rec["counts"] == {
        "passed": 2,
        "failed": 1,
        "skipped": 1,
        "errors": 1,
        "xfailed": 1,
        "xpassed": 0,
        "deselected": 1,  # the default -m "not slow" of the ini file
        "warnings": 0,
    }
    assert rec["full"] is True and rec["not_full"] == []
    assert rec["args"] == [] and rec["exit_status"] == 1
    started = datetime.fromisoformat(rec["date"])
    assert started.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=2) <= started <= datetime.now(timezone.utc)
    assert 0 < rec["seconds"] < (datetime.now(timezone.utc) - before).total_seconds()
    m = rec["machine"]
    assert m["cpus"] == os.cpu_count() and m["python"] == platform.python_version()
    assert m["torch"] == torch.__version__ and m["cuda"] is False and m["gpu"] is None
    assert m["triton_interpreter"] is True  # no CUDA: the conftest set TRITON_INTERPRET
    # a full run, but one with a failure and an error: the README never shows it
    with pytest.raises(tr.RecordError, match="has 1 failed and 1 errors"):
        tr.check_publishable(rec, str(path))


def test_naming_the_default_testpath_is_still_the_full_suite(inner):
    r, path = run_inner(inner, "t")
    rec = tr.load_record(path)
    assert rec["full"] is True, rec["not_full"]
    assert rec["args"] == ["t"] and rec["counts"]["passed"] == 2


@pytest.mark.parametrize(
    "args, reasons",
    [
        (
            ["-k", "pass", "-m", "slow or not slow", "--deselect", "t/test_mix.py::test_fails"],
            ["-k 'pass'", "-m 'slow or not slow'", "--deselect given"],
        ),
        (["t/test_mix.py"], ["selected t/test_mix.py"]),
        (["t/test_mix.py::test_pass_one"], ["selected t/test_mix.py::test_pass_one"]),
        (["-x"], ["stopped early (stopping after 1 failures)"]),
    ],
    ids=["options", "file", "node", "exitfirst"],
)
def test_a_selection_or_an_early_stop_is_not_full(inner, args, reasons):
    r, path = run_inner(inner, *args)
    rec = tr.load_record(path)
    assert rec["full"] is False
    assert rec["not_full"] == reasons
    assert rec["args"] == args
    with pytest.raises(tr.RecordError, match=r"is not a full run \(" + re.escape(reasons[0])):
        tr.check_publishable(rec, str(path))


def test_a_record_that_cannot_be_written_is_a_warning_not_an_error(inner):
    blocker = inner / "a-file"
    blocker.write_text("not a folder\n")
    r, path = run_inner(inner, "-k", "pass", record=blocker / "last-test.json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 passed" in r.stdout
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: no test record written")]
    assert len(warnings) == 1, r.stderr
    assert not path.exists()


# --- the record, rendered ------------------------------------------------------------------------------

MACHINE = {
    "cpus": 2,
    "cpus_usable": 2,
    "cpu": "AMD EPYC",
    "system": "Linux",
    "arch": "x86_64",
    "platform": "Linux-6.1-x86_64-with-glibc2.36",
    "python": "3.11.9",
    "torch": "2.13.0+cpu",
    "triton": "3.9.0",
    "pytest": "9.2.0",
    "cuda": False,
    "gpu": None,
    "triton_interpreter": True,
}


def record(not_full=(), machine=MACHINE, **stats):
    return tr.build_record(
        stats={"passed": 849, "skipped": 19, "warnings": 2, "": 1700, **stats},
        seconds=790.86,
        started=datetime(2026, 11, 24, 9, 30, tzinfo=timezone.utc),
        args=[],
        not_full=list(not_full),
        exit_status=1 if stats.get("failed") or stats.get("error") else 0,
        machine=dict(machine),
        commit="0123456789ab",
    )


def test_the_block_says_counts_time_machine_date_and_that_it_is_a_cpu_run():
    block = tr.render_block(record())
    assert block.startswith("_generated from `data/test-record.json` by `python -m mahia readme --write`_\n\n")
    text = " ".join(block.split())  # the prose is wrapped
    assert "**868 tests, 849 passed, 19 skipped**, 2 warnings, in 13 min 11 s" in text
    assert "on 2026-11-24 (UTC) at commit `0123456789ab`" in text
    assert "a 2-core AMD EPYC machine (Linux x86_64, Python 3.11.9, torch 2.13.0+cpu, triton 3.9.0;" in text
    assert "a CPU run: no CUDA GPU, the Triton kernels under the interpreter" in text
    assert tr.REFRESH in text
    assert all(len(line) <= tr.WIDTH or " " not in line for line in block.splitlines()[2:])


def test_the_block_of_a_gpu_run_names_the_gpu_and_is_no_cpu_run():
    text = " ".join(tr.render_block(record(machine={**MACHINE, "cuda": True, "gpu": "NVIDIA H200"})).split())
    assert "on the GPU, NVIDIA H200" in text and "CPU run" not in text


def test_without_a_record_the_block_says_there_is_none(tmp_path):
    assert tr.committed_record(tmp_path) is None
    block = tr.render_block(tr.committed_record(tmp_path))
    text = " ".join(block.split())
    assert "No test record is committed yet (there is no `data/test-record.json`)" in text
    assert tr.REFRESH in text and "tests," not in text


@pytest.mark.parametrize(
    "seconds, words", [(0.4, "0 s"), (59.4, "59 s"), (60, "1 min 0 s"), (790.86, "13 min 11 s"), (3725, "1 h 02 min")]
)
def test_format_duration(seconds, words):
    assert tr.format_duration(seconds) == words


def test_replace_block_needs_one_pair_of_markers():
    text = f"intro\n{tr.BEGIN}\nold\n{tr.END}\nrest\n"
    assert tr.replace_block(text, "new\n") == f"intro\n{tr.BEGIN}\nnew\n{tr.END}\nrest\n"
    for bad in ("no markers\n", f"{tr.END}\n{tr.BEGIN}\n", text + text):
        with pytest.raises(tr.RecordError, match="one <!-- tests:begin -->"):
            tr.replace_block(bad, "new\n")


def test_a_record_round_trips_and_keeps_a_plugins_own_outcome(tmp_path):
    rec = record()
    assert tr.load_record(tr.write_record(rec, tmp_path / "r.json")) == rec
    assert rec["counts"]["passed"] == 849 and rec["counts"]["errors"] == 0 and "" not in rec["counts"]
    rerun = record(rerun=3)
    assert rerun["counts"]["rerun"] == 3
    assert "**868 tests," in " ".join(tr.render_block(rerun).split())  # a rerun is no test of its own


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no test record at"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "is not a test record"),
        (json.dumps({**record(), "full": "yes"}), "no valid 'full'"),
        (json.dumps({**record(), "counts": {"passed": 3}}), "no valid count of 'failed'"),
        (json.dumps({**record(), "date": "yesterday"}), "not ISO 8601"),
        (json.dumps({**record(), "version": 99}), "version 99"),
    ],
    ids=["missing", "not-json", "not-an-object", "bad-full", "counts", "date", "version"],
)
def test_a_missing_or_malformed_record_is_refused(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(tr.RecordError, match=message):
        tr.load_record(path)


def test_publish_copies_only_a_full_run_where_nothing_failed(tmp_path):
    src = tr.write_record(record(), tmp_path / "last.json")
    assert tr.publish(src, tmp_path / "repo") == record()
    assert tr.committed_record(tmp_path / "repo") == record()
    for bad, message in (
        (record(not_full=["-k 'x'"]), r"not a full run \(-k 'x'\)"),
        (record(failed=2), "has 2 failed"),
        (record(error=1), "has 1 errors"),
    ):
        src = tr.write_record(bad, tmp_path / "bad.json")
        with pytest.raises(tr.RecordError, match=message):
            tr.publish(src, tmp_path / "other")
        assert not (tmp_path / "other").exists()


# --- the README ----------------------------------------------------------------------------------------


def readme_block(text: str) -> str:
    assert text.count(tr.BEGIN) == 1 and text.count(tr.END) == 1, "README.md lost its test block markers"
    return text.split(tr.BEGIN, 1)[1].split(tr.END, 1)[0].removeprefix("\n")


def test_the_readme_block_is_what_the_committed_record_renders_to():
    """Regenerate it with `python -m mahia readme --write` (after `--test-record runs/last-test.json`)."""
    assert readme_block((ROOT / "README.md").read_text()) == tr.render_block(tr.committed_record(ROOT))


def test_the_readme_types_no_test_count_or_timing_outside_the_block():
    text = (ROOT / "README.md").read_text()
    outside = text.split(tr.BEGIN)[0] + text.split(tr.END)[1]
    assert "781 tests" not in outside and "14 min 46 s" not in outside


def _refused(capsys, argv: list[str]) -> str:
    readme = (ROOT / "README.md").read_text()
    committed = (ROOT / tr.COMMITTED).exists()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert (ROOT / "README.md").read_text() == readme and (ROOT / tr.COMMITTED).exists() == committed
    return err


@pytest.mark.parametrize("write", [[], ["--write"]], ids=["print", "write"])
def test_the_readme_command_refuses_a_missing_partial_or_failing_record(tmp_path, capsys, write):
    assert "no test record at" in _refused(capsys, ["readme", *write, "--test-record", str(tmp_path / "none.json")])
    partial = tr.write_record(record(not_full=["selected tests/test_x.py"]), tmp_path / "partial.json")
    err = _refused(capsys, ["readme", *write, "--test-record", str(partial)])
    assert "is not a full run (selected tests/test_x.py)" in err
    failing = tr.write_record(record(failed=1), tmp_path / "failing.json")
    assert "has 1 failed" in _refused(capsys, ["readme", *write, "--test-record", str(failing)])


def test_the_readme_command_copies_a_record_in_and_renders_it(tmp_path, capsys, monkeypatch):
    import mahia.measure.files as files
    from mahia.__main__ import BEGIN, END
    from mahia.measure.report import RUNS_BEGIN, RUNS_END

    repo = tmp_path / "repo"
    # the command renders every generated block: the reference folder (one GPU here) and the markers of each
    shutil.copytree(ROOT / "data" / "results" / "nvidia-h200", repo / "data" / "results" / "nvidia-h200")
    (repo / "README.md").write_text(
        f"# r\n\n{RUNS_BEGIN}\n{RUNS_END}\n{BEGIN}\n{END}\n{tr.BEGIN}\n{tr.render_block(None)}{tr.END}\n\nmore\n"
    )
    monkeypatch.setattr(files, "REPO_ROOT", repo)
    src = tr.write_record(record(), tmp_path / "last-test.json")
    assert main(["readme", "--test-record", str(src)]) == 0  # print only: nothing written
    assert readme_block(capsys.readouterr().out) == tr.render_block(record())
    assert not (repo / tr.COMMITTED).exists()
    assert main(["readme", "--write", "--test-record", str(src)]) == 0
    assert json.loads((repo / tr.COMMITTED).read_text()) == record()
    text = (repo / "README.md").read_text()
    assert readme_block(text) == tr.render_block(record()) and text.endswith(f"{tr.END}\n\nmore\n")
    assert main(["readme", "--write"]) == 0  # from the committed record: the same README
    assert (repo / "README.md").read_text() == text
    (repo / tr.COMMITTED).write_text("{}")
    assert main(["readme"]) == 2  # a broken committed record: one line, exit 2
    assert "is not a test record" in capsys.readouterr().err
