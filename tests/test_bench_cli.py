"""``python -m mahia.bench`` on a CPU: it runs the quick sizes, says what it ran and what it skipped,
prints only its own rows, and leaves the files of other commands (the ceilings a notebook run measured)
as they were."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from mahia.measure import hardware
from mahia.measure.results import HEADLINE_KEYS

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args, results: Path):
    # as a user runs it: no Triton interpreter (the test set-up's), not part of a runner run
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MAHIA_RUN_ID", "MAHIA_PROFILE")}
    return subprocess.run(
        [sys.executable, "-m", "mahia.bench", *args, "--device", "cpu", "--results-dir", str(results)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_bench_on_a_cpu_runs_the_quick_sizes_and_touches_no_other_commands_files(tmp_path):
    folder = tmp_path / hardware.device_slug("cpu")
    folder.mkdir()
    theirs = {name: json.dumps({"written_by": "a notebook run"}) for name in ("ceilings.json", "ceilings-quick.json")}
    for name, text in theirs.items():
        (folder / name).write_text(text)
    r = _bench("kernels", "--part", "host", results=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--quick is implied" in r.stdout  # not "skipped: these are GPU kernels" with nothing measured
    assert "skipped: liger" in r.stdout  # the suite says what it left out on a CPU
    ran = re.search(r"^ran: kernels \((\d+) records\)$", r.stdout, flags=re.M)
    assert ran and int(ran.group(1)) > 0, r.stdout[-2000:]
    for name, text in theirs.items():
        assert (folder / name).read_text() == text, f"{name} was replaced"
    printed = set(re.findall(r"\w+", r.stdout))
    assert not printed & set(HEADLINE_KEYS), "it printed headline metrics that are not its own rows"
    records = pd.read_csv(folder / "bench_kernels.csv")
    assert len(records) == int(ran.group(1)) and set(records["profile"]) == {"quick"}


def test_bench_plan_writes_nothing_and_a_bad_suite_is_one_line_and_exit_2(tmp_path):
    r = _bench("kernels", "--part", "list", results=tmp_path / "results")
    assert r.returncode == 0 and "plan (nothing measured)" in r.stdout and "limits measured" not in r.stdout, r.stderr
    assert not (tmp_path / "results").exists()
    r = _bench("kernelz", results=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "unknown suite" in r.stderr
