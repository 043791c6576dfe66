"""The runner's contract: typed and refused parameters, a failure named with its cell, a per-notebook limit,
Ctrl-C and SIGTERM that stop the notebook's kernel and write the report, one folder per run, bad input as one
line and exit 2 before anything runs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from mahia import runner
from mahia.__main__ import _parser

ROOT = Path(__file__).resolve().parent.parent
HAS_GPU = torch.cuda.is_available()
PARAMS = "device = 'auto'\nprofile = 'quick'\nseed = 0\ninteractive = True\nresults_dir = None\n"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mahia", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _notebook(path: Path, params: str, *body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(PARAMS + params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_markdown_cell("prose is not counted")]
    nb.cells += [nbformat.v4.new_code_cell(b) for b in body]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def _run(tmp_path, **kw):
    folders = dict(out=str(tmp_path / "out"), results_dir=str(tmp_path / "res"), figures_dir=str(tmp_path / "fig"))
    return runner.run(device="cpu", progress=False, **folders | kw)


def _outcomes(folder: Path) -> dict:
    return {o["name"]: o for o in json.loads((folder / "outcomes.json").read_text())}


# -- a run of real notebooks under papermill ------------------------------------------------------------------
def test_a_failing_notebook_is_named_with_its_cell_and_the_run_goes_on(tmp_path, monkeypatch):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "01_breaks.ipynb", "extra = None", "x = 1", "raise ValueError('planted failure')")
    _notebook(
        nbdir / "02_fine.ipynb", "extra = None", "assert profile == 'quick' and not interactive and extra == [1, 2]"
    )
    # a notebook that does not declare a -p name is run without it
    _notebook(nbdir / "03_other.ipynb", "other = 3", "assert 'extra' not in globals() and other == 3")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbdir)
    assert _run(tmp_path, timeout=300, params=["extra=[1, 2]"]) == 1
    outcomes = _outcomes(tmp_path / "out")
    assert outcomes["01_breaks"]["status"] == "failed"
    assert outcomes["01_breaks"]["cell"] == 3  # parameters, x = 1, the raise: papermill's injected cell not counted
    assert outcomes["01_breaks"]["error"] == "ValueError: planted failure"
    assert outcomes["02_fine"]["status"] == "ok" and outcomes["03_other"]["status"] == "ok", outcomes
    assert [c["cell"] for c in outcomes["02_fine"]["slowest_cells"]][:1] in ([1], [2])
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["profile"] == "quick" and run["parts"] == ["01_breaks", "02_fine", "03_other"] and run["commit"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| 01_breaks | failed |" in md and "cell 3: ValueError: planted failure" in md


SLEEPY = (
    "import os, pathlib, time\npathlib.Path(os.environ['MAHIA_PID_FILE']).write_text(str(os.getpid()))\ntime.sleep(300)"
)
RUNNER = """
import sys
from pathlib import Path
from mahia import runner
tmp, timeout = Path(sys.argv[1]), float(sys.argv[2])
runner.NOTEBOOK_DIR = tmp / "notebooks"
sys.exit(runner.run(device="cpu", out=str(tmp / "out"), results_dir=str(tmp / "res"), figures_dir=str(tmp / "fig"),
                    progress=False, timeout=timeout))
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, None], ids=["ctrl-c", "sigterm", "timeout"])
def test_a_signal_or_the_limit_stops_the_notebooks_kernel_and_the_report_is_written(tmp_path, sig):
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    _notebook(nbdir / "01_sleepy.ipynb", "", "x = 1", SLEEPY)
    _notebook(nbdir / "02_after.ipynb", "", "x = 2")
    env = dict(os.environ, MAHIA_PID_FILE=str(tmp_path / "kernel.pid"))
    timeout = "600" if sig else "30"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path), timeout],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "kernel.pid").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        kernel = int((tmp_path / "kernel.pid").read_text())
        if sig:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert not _running(kernel), "the stopped notebook's kernel is still running"
    outcomes = _outcomes(tmp_path / "out")
    assert outcomes["01_sleepy"]["cell"] == 3
    if sig is None:
        assert proc.returncode == 1 and outcomes["01_sleepy"]["status"] == "timeout"
        assert outcomes["02_after"]["status"] == "ok"
        return
    assert proc.returncode == 128 + sig, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted by {sig.name}: stopped 01_sleepy at cell 3"), err
    assert outcomes["01_sleepy"]["status"] == "interrupted" and outcomes["02_after"]["status"] == "not run"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| 01_sleepy | interrupted |" in report and "recorded anything" in report


def test_a_signal_handler_is_installed_only_for_the_run():
    flag = runner.StopFlag()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with flag.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # a second signal changes nothing: the first one is reported
        time.sleep(0.1)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert flag.name == "SIGTERM"


def test_ctrl_c_before_a_run_has_its_handler_is_one_line(monkeypatch, capsys):
    from mahia.__main__ import main

    def interrupted(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    assert main(["run"]) == 130 and capsys.readouterr().err == "interrupted\n"


def test_each_run_gets_its_own_folder_and_a_report_when_nothing_was_recorded(tmp_path, capsys, bare_notebook_dir):
    earlier = tmp_path / "out"
    earlier.mkdir()
    (earlier / "report.md").write_text("the earlier run's report")
    for _ in range(2):  # the same command twice, as a reference part resumed on the same machine
        assert _run(tmp_path) == 1
    assert (earlier / "report.md").read_text() == "the earlier run's report"
    for later in (tmp_path / "out-2", tmp_path / "out-3"):
        md = (later / "report.md").read_text()
        assert "recorded anything" in md and "| 01_bare | failed |" in md and "no cell tagged 'parameters'" in md
        assert (later / "report.html").read_text().startswith("<!doctype html>")
    assert f"holds an earlier run (report.md): this run writes to {tmp_path / 'out-2'}" in capsys.readouterr().out
    assert not any((tmp_path / "res").iterdir())  # nothing invented


# -- bad input: one line, exit 2, nothing run ----------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--profile", "fast"], "--profile must be"),
        (["run", "--device", "tpu"], "device must be"),
        (["run", "--notebooks", ""], "has an empty name"),
        (["run", "--notebooks", "00,"], "has an empty name"),
        (["run", "--notebooks", "99"], "'99' matches nothing"),
        (["run", "--timeout", "0"], "--timeout must be positive"),
        (["run", "--param", "no-equals-sign"], "--param expects NAME=VALUE"),
        (["run", "--param", "device=cuda"], "use the runner's own --device"),
        (["run", "-n", "00", "--param", "batchsize=8"], "no selected notebook has such a parameter"),
        (["run", "-n", "06", "-p", "loss_tol=abc"], "loss_tol: float"),  # literal defaults of the committed cells
        (["run", "-n", "07", "-p", "probes=1.5"], "probes: int"),
        (["run", "-n", "00", "--results-dir", "/proc/x"], "--results-dir"),
        (["run", "-n", "00", "--out", "/proc/mahia-out"], "cannot write there"),
        (["run", "-n", "00", "--out", __file__], "is a file, not a folder"),
        (["reference", "--device", "cpu", "--allow-dirty"], "a GPU run"),
        pytest.param(["run", "--device", "cuda"], "no CUDA GPU", marks=pytest.mark.skipif(HAS_GPU, reason="a GPU")),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = _cli(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr


def test_notebooks_are_chosen_by_number_name_or_repeated_option_and_params_are_typed():
    args = _parser().parse_args(["run", "-n", "1", "-n", "2,03"])
    assert [p.name[:2] for p in runner.select_notebooks(args.notebooks)] == ["01", "02", "03"]
    assert runner.select_notebooks(["all"]) == runner.select_notebooks(None) == runner.list_notebooks()
    assert runner.select_notebooks("00_environment_and_roofline") == runner.select_notebooks("0")
    got = runner.parse_params(["batch=8", "lr=1e-3", "name=small", "modes=('a', 'b')", "flag=true"])
    assert got == {"batch": 8, "lr": 1e-3, "name": "small", "modes": ["a", "b"], "flag": True}


@pytest.mark.parametrize(
    "value, annotation, ok",
    [
        (8, "int", True),
        ("notanumber", "int | None", False),
        (None, "int | None", True),
        (True, "int", False),  # JSON true is no count
        (2, "float", True),
        (3, "str", False),
        ("x", "Optional[int]", False),
        ([512, 1000], "tuple[int, int] | None", True),  # -p values travel as JSON: a tuple arrives as a list
        ([512], "tuple[int, int] | None", False),
        (["default", 3], "tuple[str, ...]", False),
        ("fp8", "Literal['bf16', 'fp16'] | None", False),
        ({"a": 1}, "dict[str, int]", True),
        ("anything", "torch.dtype", True),  # a type the checker does not know is not checked
        ("anything", "'int | None'", False),  # a quoted annotation
    ],
)
def test_conforms(value, annotation, ok):
    assert runner.conforms(value, annotation) is ok


def test_parameters_are_read_from_annotations_and_literal_defaults_and_checked(tmp_path, monkeypatch, capsys):
    nb = _notebook(
        tmp_path / "08_moe.ipynb",
        "n_experts: int | None = None\nshape: 'tuple[int, int] | None' = None\ntop_k = None\nprobes = 3\n"
        "modes = ('none', 'full')\nmixed = (1, 'a')\nsize = 2**16",
    )
    assert runner.notebook_parameters(nb) == {
        **{"device": "str", "profile": "str", "seed": "int", "interactive": "bool", "results_dir": None},
        **{"n_experts": "int | None", "shape": "tuple[int, int] | None", "top_k": None, "probes": "int"},
        **{"modes": "tuple[str, ...]", "mixed": "tuple", "size": None},  # None: not checked
    }
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path)
    with pytest.raises(runner.UsageError, match=r"n_experts='notanumber': 08_moe declares `n_experts: int \| None`"):
        _run(tmp_path, params=["n_experts=notanumber"])
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(runner, "_run_parts", lambda *a, **k: [])
    monkeypatch.setattr(runner, "_finish", lambda sess, outcomes: 0)
    assert _run(tmp_path, params=["n_experts=16", "top_k=x"]) == 0
    assert "note: -p top_k (08_moe): not type-checked" in capsys.readouterr().out


# -- the committed notebooks and the save hook ------------------------------------------------------------------
def test_committed_notebooks_are_clean_with_parameters_and_the_save_hook_keeps_them_so():
    for nb in runner.list_notebooks():
        assert runner.notebook_is_clean(nb), f"{nb.name} is committed with outputs"
        assert runner.notebooks._has_parameters_cell(nb), f"{nb.name} has no cell tagged 'parameters'"
        assert json.loads(nb.read_text())["metadata"]["kernelspec"]["name"] == "python3", nb.name
    nb = json.loads(runner.list_notebooks()[0].read_text())
    nb["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x"}]
    nb["metadata"]["language_info"] = {"version": "3.99"}
    model = {"type": "notebook", "content": nb}
    runner.strip_on_save(model, f"notebooks/{runner.list_notebooks()[0].name}")
    assert "language_info" not in model["content"]["metadata"]
    assert all(not c.get("outputs") for c in model["content"]["cells"])
    other = {"type": "notebook", "content": {"metadata": {"language_info": {}}}}
    runner.strip_on_save(other, "scratch.ipynb")
    assert other["content"]["metadata"] == {"language_info": {}}


# -- help ------------------------------------------------------------------------------------------------------
def test_every_option_has_help_that_states_its_default():
    import argparse

    from mahia.bench.__main__ import _parser as bench_parser
    from mahia.profile import _parser as profile_parser

    parsers = {"mahia": _parser(), "mahia.bench": bench_parser(), "mahia.profile": profile_parser()}
    for sub in (a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)):
        parsers.update({f"mahia {name}": p for name, p in sub.choices.items()})
    for prog, p in parsers.items():
        assert "%(default)" not in p.format_help()
        for action in p._actions:
            if action.dest in ("help", "cmd"):
                continue
            where = f"{prog} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and ("default" in action.help or "required" in action.help), where
            if action.default not in (None, False, [], "==SUPPRESS==") and "%(default)" not in action.help:
                assert str(action.default) in action.help, f"{where}: help does not say its default {action.default!r}"
    assert "python -m mahia run -n 00 -n 03" in _parser().format_help()


# -- the bytecode cache -----------------------------------------------------------------------------------------
def test_a_bytecode_cache_is_given_only_where_python_would_keep_none(tmp_path, monkeypatch):
    from mahia.runner.session import bytecode_cache

    env = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}
    assert "PYTHONDONTWRITEBYTECODE" in bytecode_cache(env, tmp_path / "pyc")
    assert env == {"PYTHONPYCACHEPREFIX": str(tmp_path / "pyc"), "PATH": "/bin"}
    mine = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/mine"}
    assert bytecode_cache(dict(mine), tmp_path) is None
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    env = {}
    assert bytecode_cache(env, tmp_path / "pyc", package_file=str(pkg / "__init__.py")) is None and env == {}
    monkeypatch.setattr(runner.session.os, "access", lambda path, mode: False)  # read-only, also for root
    why = bytecode_cache(env, tmp_path / "pyc", package_file=str(pkg / "__init__.py"))
    assert "read-only" in why and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")
