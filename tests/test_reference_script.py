"""tools/reference_run.sh: every part records its commit spelled one way, and packs only its own parts."""

import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "reference_run.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("given", "recorded"),
    [
        ("b34185deecfdfc3f8e93fa89e416d2436000b430", "b34185deecfd"),
        ("b34185deecfdfc3f8e93fa89e416d2436000b430-dirty", "b34185deecfd-dirty"),
        ("0dea75a", "0dea75a"),  # a shorter abbreviation is kept as given
    ],
)
def test_full_sha_is_shortened_to_gits_twelve(tmp_path, given, recorded):
    # A stand-in Python that prints the MAHIA_COMMIT it was started with; no part runs (param=... only).
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "${MAHIA_COMMIT:-unset}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PYTHON": str(fake), "MAHIA_COMMIT": given, "OUT": str(tmp_path)}
    out = subprocess.run(
        ["bash", str(SCRIPT), "t1", "param=batch=2"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert f"commit: {recorded}\n" in out.stdout
    assert (tmp_path / "t1.tgz").exists()  # packed on exit, as after any call


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
@pytest.mark.parametrize("fit", [False, True])
def test_archive_holds_only_the_parts_of_its_own_call(tmp_path, fit):
    # While this call runs notebook 04, another call on the same machine writes notebook 10's files: this call's
    # archive holds 04's and the shared ones, not a half-written 10_full_stack.csv. Its own 05 stops before its
    # part file: 05's rows and figure stay out too. With FIT=1, 05 (10,000 s last time) is not even started.
    repo = SCRIPT.parents[1]
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -m ] && [ "$3" = commit ]; then echo abc; exit 0; fi\n'
        'if [ "$1" = -m ] && [ "$3" = reference ]; then\n'
        "  sleep 0.05; mkdir -p data/results/gpu/parts figures/gpu\n"
        "  touch data/results/gpu/04_torch_compile.csv data/results/gpu/parts/04_torch_compile.json \\\n"
        "        figures/gpu/04_torch_compile_modes.png data/results/gpu/ceilings.json \\\n"
        "        data/results/gpu/10_full_stack.csv data/results/gpu/parts/10_full_stack.json \\\n"
        "        figures/gpu/10_full_stack_ladder.png data/results/gpu/bench_kernels.csv \\\n"
        "        data/results/gpu/05_cuda_graphs.csv figures/gpu/05_cuda_graphs_sweep.png\n"
        "  exit 0\n"
        "fi\n"
        'if [ "$1" = -c ] && [[ "$2" == *device_slug* ]]; then echo gpu; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path), "PYTHONPATH": str(repo)}
    if fit:
        (tmp_path / "data/results/gpu/parts").mkdir(parents=True)
        (tmp_path / "data/results/gpu/parts/05_cuda_graphs.json").write_text(
            '{"status": "ok", "commit": "old", "profile": "full", "seconds": 1e4}'
        )
        env |= {"FIT": "1", "DEADLINE": "500"}
    out = subprocess.run(["bash", str(SCRIPT), "t2", "nb=04,05"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert ("05_cuda_graphs: 10000 s expected" in out.stderr) == fit, out.stderr
    assert "could not name" not in out.stderr, out.stderr
    assert "05_cuda_graphs did not finish" in out.stderr and "04_torch_compile did not" not in out.stderr
    with tarfile.open(tmp_path / "t2.tgz") as tar:
        packed = {n for n in tar.getnames() if not n.startswith("runs/")}
    assert packed == {
        "data/results/gpu/04_torch_compile.csv",
        "data/results/gpu/parts/04_torch_compile.json",
        "figures/gpu/04_torch_compile_modes.png",
        "data/results/gpu/ceilings.json",
    }
