"""The runner's contract: typed and refused parameters, a failure named with its cell, a per-notebook limit,
Ctrl-C and SIGTERM that stop the kernel and write the report, one folder per run, bad input one line and exit 2
(for every command: ``python -m mahia``, ``mahia.bench``, ``mahia.profile``)."""

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


@pytest.fixture
def nbdir(tmp_path, monkeypatch) -> Path:
    """An empty notebook folder that the runner reads instead of notebooks/."""
    (tmp_path / "notebooks").mkdir()
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", tmp_path / "notebooks")
    return tmp_path / "notebooks"


def test_a_failing_notebook_is_named_with_its_cell_and_the_run_goes_on(tmp_path, nbdir, monkeypatch):
    # Kernels die at start-up, as side by side ones can (papermill#239): 00's twice, 01's once (started again).
    (site := tmp_path / "site").mkdir()
    (site / "sitecustomize.py").write_text(  # a kernel is started with -f CONNECTION_FILE; papermill is not
        f"import os, sys\nf = {str(tmp_path / 'starts')!r}\nif '-f' in sys.argv:\n    with open(f, 'a') as h:\n"
        "        h.write('x')\n    if os.path.getsize(f) <= 3:\n        os._exit(1)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    _notebook(nbdir / "00_unlucky.ipynb", "", "x = 1")
    _notebook(nbdir / "01_breaks.ipynb", "extra = None", "x = 1", "raise ValueError('planted failure')")
    _notebook(
        nbdir / "02_fine.ipynb", "extra = None", "assert profile == 'quick' and not interactive and extra == [1, 2]"
    )
    # a notebook that does not declare a -p name is run without it
    _notebook(nbdir / "03_other.ipynb", "other = 3", "assert 'extra' not in globals() and other == 3")
    assert _run(tmp_path, timeout=300, params=["extra=[1, 2]"]) == 1
    outcomes = _outcomes(tmp_path / "out")
    failed = outcomes["01_breaks"]  # cells: parameters, x = 1, the raise (papermill's injected cell not counted)
    assert (failed["status"], failed["cell"], failed["error"]) == ("failed", 3, "ValueError: planted failure")
    assert outcomes["00_unlucky"]["error"].endswith("RuntimeError: Kernel died before replying to kernel_info")
    assert (tmp_path / "starts").read_text() == "x" * 6  # 00: 2, 01: 2, 02 and 03: 1 each
    assert outcomes["02_fine"]["status"] == "ok" and outcomes["03_other"]["status"] == "ok", outcomes
    assert [c["cell"] for c in outcomes["02_fine"]["slowest_cells"]][:1] in ([1], [2])
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (
        run["profile"] == "quick"
        and run["parts"] == ["00_unlucky", "01_breaks", "02_fine", "03_other"]
        and run["commit"]
    )
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
def test_a_signal_or_the_limit_stops_the_notebooks_kernel_and_the_report_is_written(tmp_path, nbdir, sig):
    _notebook(nbdir / "01_sleepy.ipynb", "", "x = 1", SLEEPY)
    _notebook(nbdir / "02_after.ipynb", "", "x = 2")
    env = dict(os.environ, MAHIA_PID_FILE=str(tmp_path / "kernel.pid"))
    timeout = "600" if sig else "30"
    pipes = dict(text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # its own group
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), timeout], env=env, cwd=ROOT, **pipes)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "kernel.pid").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        kernel = int((tmp_path / "kernel.pid").read_text())
        if sig:
            os.killpg(proc.pid, sig)  # the whole group, as Ctrl-C in a terminal or `timeout` do: papermill too
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    # Papermill shuts its kernel down; were it killed first, ipykernel's parent poller ends the kernel within
    # about a second. Under load that can come just after the runner's exit (one CI run, 2026-12-04): wait a little.
    deadline = time.monotonic() + 10
    while _running(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
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


@pytest.mark.parametrize(
    "command, message",
    [
        ("mahia run --profile fast", "--profile must be"),
        ("mahia run --device tpu", "device must be"),
        ("mahia run --notebooks=", "has an empty name"),
        ("mahia run --notebooks 99", "'99' matches nothing"),
        ("mahia run --timeout 0", "--timeout must be positive"),
        ("mahia run --param no-equals-sign", "--param expects NAME=VALUE"),
        ("mahia run --param device=cuda", "use the runner's own --device"),
        ("mahia run -n 00 --param batchsize=8", "such a parameter; theirs: none but the runner's own options"),
        ("mahia run -n 06 -p loss_tol=abc", "loss_tol: float"),  # literal defaults of the committed cells
        ("mahia run -n 00 --results-dir /proc/x", "--results-dir"),
        (f"mahia run -n 00 --out {__file__}", "is a file, not a folder"),
        ("mahia reference --device cpu --allow-dirty", "a GPU run"),
        pytest.param("mahia run --device cuda", "no CUDA GPU", marks=pytest.mark.skipif(HAS_GPU, reason="a GPU")),
        ("mahia.bench kernelz --device cpu", "unknown suite"),
        ("mahia.profile --preset tiny --seq-len 4096 --device cpu", "max_seq_len"),
        ("mahia.profile --preset tiny --device cpu --by-module --checkpoint full", "--checkpoint"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(command, message):
    r = subprocess.run([sys.executable, "-m", *command.split()], capture_output=True, text=True, cwd=ROOT, timeout=120)
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
        (3, "str", False),
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
    find, gone = runner.importlib.util.find_spec, ("nbconvert", "mistune")  # half the extra: refused before a run
    with monkeypatch.context() as m:
        m.setattr(runner.importlib.util, "find_spec", lambda name, *a: None if name in gone else find(name, *a))
        with pytest.raises(runner.UsageError, match=r"^nbconvert and mistune not installed: pip install 'mahia\["):
            _run(tmp_path, params=["n_experts=16"])
        with pytest.raises(runner.UsageError, match=r"^mistune not installed"):  # no notebook: its report.html needs it
            runner._checked(1.0, [], [])
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(runner, "_run_parts", lambda *a, **k: [])
    monkeypatch.setattr(runner, "_finish", lambda sess, outcomes: 0)
    assert _run(tmp_path, params=["n_experts=16", "top_k=x"]) == 0
    assert "note: -p top_k (08_moe): not type-checked" in capsys.readouterr().out


def test_committed_notebooks_are_clean_with_parameters_and_the_save_hook_spares_other_notebooks():
    for nb in runner.list_notebooks():
        assert runner.notebook_is_clean(nb), f"{nb.name} is committed with outputs"
        assert runner.notebooks._has_parameters_cell(nb), f"{nb.name} has no cell tagged 'parameters'"
        assert json.loads(nb.read_text())["metadata"]["kernelspec"]["name"] == "python3", nb.name
    # the save hook (`make lab`'s; test_lab.py checks it strips a tracked notebook) leaves the user's own alone
    other = {"type": "notebook", "content": {"metadata": {"language_info": {}}}}
    runner.strip_on_save(other, "scratch.ipynb")
    assert other["content"]["metadata"] == {"language_info": {}}


def test_a_bytecode_cache_is_given_only_where_python_would_keep_none(tmp_path, monkeypatch):
    from mahia.runner.session import bytecode_cache

    env = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}
    assert "PYTHONDONTWRITEBYTECODE" in bytecode_cache(env, tmp_path / "pyc")
    assert env == {"PYTHONPYCACHEPREFIX": str(tmp_path / "pyc"), "PATH": "/bin"}
    assert bytecode_cache({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/mine"}, tmp_path) is None
    env, pkg = {}, tmp_path / "__init__.py"
    pkg.write_text("")
    assert bytecode_cache(env, tmp_path / "pyc", package_file=str(pkg)) is None and env == {}
    monkeypatch.setattr(runner.session.os, "access", lambda path, mode: False)  # read-only, also for root
    assert "read-only" in bytecode_cache(env, tmp_path / "pyc", package_file=str(pkg))
