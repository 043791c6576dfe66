"""The runner and its command line: signals, run folders, bad input, parameter types, reports, cell numbers.

* Ctrl-C and SIGTERM stop the running notebook's processes (papermill's group and the kernel's session),
  write the report of what ran and exit 130 / 143 with one line;
* every bad ``--out``, ``--notebooks`` and ``-p`` is one line on stderr and exit 2, before anything runs;
  ``-n`` repeats;
* ``-p`` values are checked against the types the parameters cell declares (annotation or literal default);
* a report is written for every run, and cell numbers are the source notebook's.

No test here starts a Jupyter kernel: the notebooks are stood in for by small processes.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from mahia import runner
from mahia.__main__ import _parser

ROOT = Path(__file__).resolve().parent.parent
LINUX = Path("/proc/self/stat").exists()


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "mahia", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _one_line_exit_2(r, message):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def _notebook(path: Path, params: str, *body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(
        f"device = 'auto'\nprofile = 'quick'\nseed = 0\ninteractive = True\nresults_dir = None\n{params}"
    )
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell] + [nbformat.v4.new_code_cell(b) for b in body]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


# -- Ctrl-C and SIGTERM -------------------------------------------------------------------------------------
# The runner, with papermill replaced by a process that writes a partly executed notebook (papermill's
# injected cell included, the fourth code cell still running) and starts a "kernel" in a session of its
# own, as jupyter_client does. With stubborn=1 both ignore SIGTERM: only the SIGKILL after the grace
# period stops them.
RUNNER = r'''
import sys
from pathlib import Path
from mahia import runner

tmp, stubborn = Path(sys.argv[1]), sys.argv[2]
runner.NOTEBOOK_DIR = tmp / "notebooks"
runner.session.KILL_GRACE_S = 1.0
CHILD = """
import json, os, signal, subprocess, sys, time
tmp, out_nb, stubborn = sys.argv[1:]
if stubborn == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleeper = ("import signal, sys, time\\n"
           "if sys.argv[1] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
           "time.sleep(300)")
kernel = subprocess.Popen([sys.executable, "-c", sleeper, stubborn], start_new_session=True)
def cell(tags, status):
    return {"cell_type": "code", "source": "", "outputs": [], "execution_count": None,
            "metadata": {"tags": tags, "papermill": {"status": status}}}
cells = [cell(["parameters"], "completed"), cell(["injected-parameters"], "completed"), cell([], "completed"),
         cell([], "running"), cell([], "pending")]
with open(out_nb, "w") as f:
    json.dump({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, f)
with open(os.path.join(tmp, "pids.tmp"), "w") as f:
    f.write(f"{os.getpid()} {kernel.pid}")
os.replace(os.path.join(tmp, "pids.tmp"), os.path.join(tmp, "pids"))
time.sleep(300)
"""
runner._papermill_cmd = lambda sess, nb, out_nb, mine: [sys.executable, "-c", CHILD, str(tmp), str(out_nb), stubborn]
sys.exit(
    runner.run(device="cpu", out=str(tmp / "out"), results_dir=str(tmp / "res"), figures_dir=str(tmp / "fig"),
               progress=False)
)
'''


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie runs nothing: it waits for its parent to read its status


@pytest.mark.skipif(not LINUX, reason="reads /proc")
@pytest.mark.parametrize("sig, stubborn", [(signal.SIGINT, "0"), (signal.SIGTERM, "1")], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_the_notebook_processes_and_writes_the_report(tmp_path, sig, stubborn):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "01_sleepy.ipynb", "", "x = 1")
    _notebook(nbdir / "02_after.ipynb", "", "x = 2")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path), stubborn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "pids").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the stand-in notebook never started: {proc.communicate()[1][-2000:]}")
            time.sleep(0.1)
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        assert all(_running(p) for p in pids)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted by {sig.name}: stopped 01_sleepy at cell 3"), err
    assert not any(_running(p) for p in pids), "a process of the stopped notebook is still running"
    outcomes = {o["name"]: o for o in json.loads((tmp_path / "out" / "outcomes.json").read_text())}
    assert outcomes["01_sleepy"]["status"] == "interrupted" and outcomes["01_sleepy"]["cell"] == 3
    assert outcomes["01_sleepy"]["error"] == f"stopped by {sig.name}"
    assert outcomes["02_after"]["status"] == "not run"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| 01_sleepy | interrupted |" in report and "| 02_after | not run |" in report
    assert "recorded anything" in report and (tmp_path / "out" / "report.html").exists()


def test_a_signal_handler_is_installed_only_for_the_run():
    flag = runner.StopFlag()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with flag.installed():
        assert signal.getsignal(signal.SIGINT) is flag and signal.getsignal(signal.SIGTERM) is flag
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # a second signal changes nothing: the first one is reported
        time.sleep(0.1)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert flag.signum == signal.SIGTERM and flag.name == "SIGTERM"


def test_ctrl_c_before_a_run_has_its_handler_is_one_line(monkeypatch, capsys):
    from mahia.__main__ import main

    def interrupted(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    assert main(["run"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


# -- bad input: one line, exit 2, nothing run ----------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "has an empty name"),
        (",", "has an empty name"),
        ("00,", "has an empty name"),
        ("99", "'99' matches nothing"),
        ("no_such_notebook", "matches nothing"),
    ],
)
def test_bad_notebooks_are_one_line_and_exit_2(spec, message):
    _one_line_exit_2(_cli("run", "--device", "cpu", "--notebooks", spec), message)


def test_repeated_notebooks_accumulate():
    args = _parser().parse_args(["run", "-n", "1", "-n", "2,03"])
    assert args.notebooks == ["1", "2,03"]
    chosen = runner.select_notebooks(args.notebooks)
    assert [p.name[:2] for p in chosen] == ["01", "02", "03"]
    assert runner.select_notebooks(["all"]) == runner.list_notebooks()
    assert _parser().parse_args(["run"]).notebooks is None  # every notebook


def test_bad_out_is_one_line_and_exit_2(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [(a_file, "is a file, not a folder"), (a_file / "sub", "cannot write there")]
    if LINUX:
        cases.append((Path("/proc/mahia-out"), "cannot write there"))  # a place no one can write, root included
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases.append((locked / "run", "cannot write there"))
    for out, message in cases:
        _one_line_exit_2(_cli("run", "--device", "cpu", "-n", "00", "--out", str(out)), message)
    assert a_file.read_text() == "x"


def test_an_out_folder_of_an_earlier_run_is_left_as_it_is(tmp_path, capsys, bare_notebook_dir):
    earlier = tmp_path / "run"
    earlier.mkdir()
    (earlier / "outcomes.json").write_text("[]")
    (earlier / "report.md").write_text("the earlier run's report")
    kw = dict(device="cpu", out=str(earlier), results_dir=str(tmp_path / "r"), figures_dir=str(tmp_path / "f"))
    for _ in range(2):  # the same command twice, as a reference part resumed on the same machine
        assert runner.run(progress=False, **kw) == 1
    assert (earlier / "outcomes.json").read_text() == "[]"
    assert (earlier / "report.md").read_text() == "the earlier run's report"
    for later in (tmp_path / "run-2", tmp_path / "run-3"):
        assert (
            json.loads((later / "outcomes.json").read_text())[0]["name"] == "01_bare" and (later / "report.md").exists()
        )
    assert f"holds an earlier run (outcomes.json): this run writes to {tmp_path / 'run-2'}" in capsys.readouterr().out


def test_bad_results_dir_is_one_line_and_exit_2(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    r = _cli("run", "--device", "cpu", "-n", "00", "--results-dir", str(a_file), "--out", str(tmp_path / "o"))
    _one_line_exit_2(r, "--results-dir")
    assert not (tmp_path / "o").exists()  # refused before the run's folder was made


# -- parameter types ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, annotation, ok",
    [
        (8, "int", True),
        ("notanumber", "int | None", False),
        (None, "int | None", True),
        (True, "int", False),  # JSON true is no count
        (2, "float", True),
        ("bf16", "str | None", True),
        (3, "str", False),
        (None, "Optional[int]", True),
        ("x", "Optional[int]", False),
        ([512, 1000], "tuple[int, int] | None", True),  # -p values travel as JSON: a tuple arrives as a list
        ([512], "tuple[int, int] | None", False),
        (["default", "max-autotune"], "tuple[str, ...]", True),
        (["default", 3], "tuple[str, ...]", False),
        ([1, 4], "list[int]", True),
        ("bf16", "Literal['bf16', 'fp16'] | None", True),
        ("fp8", "Literal['bf16', 'fp16'] | None", False),
        ({"a": 1}, "dict[str, int]", True),
        ("anything", "torch.dtype", True),  # a type the checker does not know is not checked
        ("anything", "'int | None'", False),  # a quoted annotation
    ],
)
def test_conforms(value, annotation, ok):
    assert runner.conforms(value, annotation) is ok


def test_notebook_parameters_read_annotations_and_literal_defaults(tmp_path):
    nb = _notebook(
        tmp_path / "01_p.ipynb",
        "n_experts: int | None = None  # None: by profile\nshape: 'tuple[int, int] | None' = None\n"
        "batch = None\nprobes = 3\nlr = 1e-3\nmodes = ('none', 'full')\nmixed = (1, 'a')\nsize = 2**16",
    )
    params = runner.notebook_parameters(nb)
    assert params == {
        "device": "str",
        "profile": "str",
        "seed": "int",
        "interactive": "bool",
        "results_dir": None,
        "n_experts": "int | None",
        "shape": "tuple[int, int] | None",
        "batch": None,  # None without an annotation: not checked
        "probes": "int",
        "lr": "float",
        "modes": "tuple[str, ...]",
        "mixed": "tuple",
        "size": None,  # an expression, not a literal
    }


def test_a_value_of_the_wrong_type_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "08_moe.ipynb", "n_experts: int | None = None\ntop_k = None")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbdir)
    out = tmp_path / "out"
    run = dict(device="cpu", out=str(out), results_dir=str(tmp_path / "r"), figures_dir=str(tmp_path / "f"))
    with pytest.raises(runner.UsageError, match=r"n_experts='notanumber': 08_moe declares `n_experts: int \| None`"):
        runner.run(params=["n_experts=notanumber"], **run)
    assert not out.exists()
    # a None default without an annotation cannot be checked: the run says so instead of implying it was
    monkeypatch.setattr(runner, "_run_parts", lambda sess, parts, progress, on_ok=None: [])
    monkeypatch.setattr(runner, "_finish", lambda sess, outcomes: 0)
    assert runner.run(params=["n_experts=16", "top_k=x"], **run) == 0
    assert "note: -p top_k (08_moe): not type-checked" in capsys.readouterr().out


def test_values_are_checked_against_the_committed_notebooks_declarations():
    # literal defaults in the committed parameters cells: notebook 06's loss_tol = 0.05, 07's probes = 3
    _one_line_exit_2(_cli("run", "--device", "cpu", "-n", "06", "-p", "loss_tol=abc"), "loss_tol: float")
    _one_line_exit_2(_cli("run", "--device", "cpu", "-n", "07", "-p", "probes=1.5"), "probes: int")


def test_every_none_default_parameter_is_listed_when_unchecked(tmp_path):
    nb = _notebook(tmp_path / "01_p.ipynb", "batch = None\nwidth: int | None = None")
    declared = {nb: runner.notebook_parameters(nb)}
    assert runner._unchecked(declared, {"batch": 3, "width": 4}) == ["batch (01_p)"]


# -- reports and cell numbers ---------------------------------------------------------------------------------
def test_a_report_is_written_when_nothing_was_recorded(tmp_path, bare_notebook_dir):
    out = tmp_path / "out"
    rc = runner.run(
        device="cpu", out=str(out), results_dir=str(tmp_path / "r"), figures_dir=str(tmp_path / "f"), progress=False
    )
    assert rc == 1
    md = (out / "report.md").read_text()
    assert "recorded anything" in md and "| 01_bare | failed |" in md and "no cell tagged 'parameters'" in md
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    assert not (tmp_path / "r" / "cpu").exists() and not any((tmp_path / "r").iterdir())  # nothing invented


def _executed(path: Path, *cells: tuple[list[str], dict]) -> Path:
    nb = nbformat.v4.new_notebook()
    for tags, extra in cells:
        c = nbformat.v4.new_code_cell("pass")
        c.metadata["tags"] = tags
        c.update(extra)
        nb.cells.append(c)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell("prose is not counted"))
    nbformat.write(nb, path)
    return path


def test_cell_numbers_are_the_source_notebooks(tmp_path):
    error = {"outputs": [nbformat.v4.new_output("error", ename="ValueError", evalue="planted", traceback=[])]}
    running = {"metadata": {"tags": [], "papermill": {"status": "running"}}}
    path = _executed(
        tmp_path / "01_x.ipynb",
        (["parameters"], {}),
        (["injected-parameters"], {}),
        ([], {}),
        ([], error),
    )
    assert runner._failure(path) == (3, "ValueError: planted")  # parameters, x, the raise
    path = _executed(tmp_path / "02_x.ipynb", (["parameters"], {}), (["injected-parameters"], {}), ([], running))
    assert runner.notebooks._running_cell(path) == 2


def test_slowest_cells_are_numbered_as_in_the_source_notebook(tmp_path):
    def took(seconds):
        return {"metadata": {"tags": [], "papermill": {"duration": seconds}}}

    path = _executed(
        tmp_path / "03_x.ipynb",
        (["parameters"], {"metadata": {"tags": ["parameters"], "papermill": {"duration": 0.01}}}),
        (["injected-parameters"], {"metadata": {"tags": ["injected-parameters"], "papermill": {"duration": 99.0}}}),
        ([], took(2.0)),
        ([], took(30.04)),
        ([], {}),  # not run: no duration
        ([], took(7.5)),
    )
    assert runner.slowest_cells(path) == [
        {"cell": 3, "seconds": 30.0},
        {"cell": 5, "seconds": 7.5},
        {"cell": 2, "seconds": 2.0},
    ]
    assert runner.slowest_cells(path, n=1) == [{"cell": 3, "seconds": 30.0}]
    assert runner.slowest_cells(tmp_path / "missing.ipynb") == []


# -- help ------------------------------------------------------------------------------------------------------
def _parsers():
    import argparse

    from mahia.bench.__main__ import _parser as bench_parser
    from mahia.profile import _parser as profile_parser

    top = _parser()
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    found = {
        "python -m mahia": top,
        "python -m mahia.bench": bench_parser(),
        "python -m mahia.profile": profile_parser(),
    }
    for sub in subs:
        found.update({f"python -m mahia {name}": p for name, p in sub.choices.items()})
    return found


def test_every_option_has_help_that_states_its_default():
    parsers = _parsers()
    assert {"python -m mahia run", "python -m mahia reference", "python -m mahia report"} <= set(parsers)
    for prog, p in parsers.items():
        text = p.format_help()  # renders every %(default)s
        for action in p._actions:
            if action.dest in ("help", "cmd"):
                continue
            where = f"{prog} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help.strip(), f"{where} has no help"
            assert "default" in action.help or "required" in action.help, f"{where}: its help gives no default"
            if action.default not in (None, False, [], "==SUPPRESS==") and "%(default)" not in action.help:
                assert str(action.default) in action.help, f"{where}: help does not say its default {action.default!r}"
        assert "%(default)" not in text


def test_top_level_help_shows_examples():
    text = _parser().format_help()
    assert "examples:" in text and "python -m mahia run -n 00 -n 03" in text and "-p n_experts=16" in text


def test_profile_takes_its_default_sequence_length_from_the_preset(capsys):
    from mahia.profile import main

    argv = ["--preset", "tiny", "--impl", "baseline", "--batch", "1", "--steps", "1", "--rows", "1", "--device", "cpu"]
    assert main(argv) == 0
    assert "batch 1 x 128" in capsys.readouterr().out  # tiny's max_seq_len, not the 512 it cannot take


# ------------------------------------------------------------------------------- the bytecode cache


def test_a_bytecode_cache_is_given_where_python_would_keep_none(tmp_path):
    from mahia.runner.session import bytecode_cache

    env = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}
    why = bytecode_cache(env, tmp_path / "pyc")
    assert "PYTHONDONTWRITEBYTECODE" in why
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc") and "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PATH"] == "/bin"


def test_a_users_prefix_and_a_writable_install_are_left_alone(tmp_path):
    from mahia.runner.session import bytecode_cache

    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/mine"}
    assert bytecode_cache(env, tmp_path) is None
    assert env == {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/mine"}
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    env = {}
    assert bytecode_cache(env, tmp_path / "pyc", package_file=str(pkg / "__init__.py")) is None  # writable
    assert env == {}


def test_a_read_only_install_without_a_cache_gets_one(tmp_path, monkeypatch):
    from mahia.runner.session import bytecode_cache

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.setattr(runner.session.os, "access", lambda path, mode: False)  # read-only, also for root
    env = {}
    why = bytecode_cache(env, tmp_path / "pyc", package_file=str(pkg / "__init__.py"))
    assert "read-only" in why and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")
