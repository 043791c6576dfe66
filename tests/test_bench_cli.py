"""``python -m mahia.bench`` on a CPU: it runs the quick sizes, says so, and leaves the ceilings a notebook run
measured as they were (bad input: tests/test_runner.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from mahia.measure import hardware

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args, results: Path):
    # as a user runs it: no Triton interpreter (the test set-up's), not part of a runner run
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MAHIA_RUN_ID", "MAHIA_PROFILE")}
    cmd = [sys.executable, "-m", "mahia.bench", *args, "--device", "cpu", "--results-dir", str(results)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_bench_on_a_cpu_runs_the_quick_sizes_and_touches_no_other_commands_files(tmp_path):
    folder = tmp_path / hardware.device_slug("cpu")
    folder.mkdir()
    theirs = {name: json.dumps({"written_by": "a notebook run"}) for name in ("ceilings.json", "ceilings-quick.json")}
    for name, text in theirs.items():
        (folder / name).write_text(text)
    r = _bench("kernels", "--part", "host", results=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--quick is implied" in r.stdout  # not "skipped: these are GPU kernels" with nothing measured
    ran = re.search(r"^ran: kernels \((\d+) records\)$", r.stdout, flags=re.M)
    assert ran and int(ran.group(1)) > 0, r.stdout[-2000:]
    for name, text in theirs.items():
        assert (folder / name).read_text() == text, f"{name} was replaced"
    records = pd.read_csv(folder / "bench_kernels.csv")
    assert len(records) == int(ran.group(1)) and set(records["profile"]) == {"quick"}
