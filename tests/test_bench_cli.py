"""``python -m mahia.bench`` on a CPU: it runs the quick sizes, says so, and leaves the ceilings a notebook run
measured as they were (bad input: tests/test_runner.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

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


def test_fla_configs_come_back_as_its_autotuner_chose_them(tmp_path, monkeypatch):
    triton = pytest.importorskip("triton")
    from mahia.bench import meta

    def kernel(x, N, BLOCK: triton.language.constexpr):
        pass

    kernel.__module__ = "fla.ops.stand_in"  # an fla kernel, as far as the lookup goes
    tuner = triton.autotune([triton.Config({"BLOCK": 16}, num_warps=2), triton.Config({"BLOCK": 32})], key=["N"])(
        triton.jit(kernel)
    )
    key = (4096, "torch.bfloat16")
    tuner.cache[key] = tuner.configs[0]
    monkeypatch.setattr(meta, "_versions", lambda: {"fla": "0.6.0", "triton": "3.6.0"})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    meta._save_fla_configs(tmp_path / "gpu.json")
    tuner.cache.clear()
    assert "data/fla/gpu.json" in meta._load_fla_configs(tmp_path / "gpu.json")
    got = tuner.cache[key]
    assert (got.kwargs, got.num_warps, got.num_stages, got.pre_hook) == ({"BLOCK": 16}, 2, 3, None)
    tuner.cache.clear()  # another fla or Triton: autotune again
    monkeypatch.setattr(meta, "_versions", lambda: {"fla": "0.7.0", "triton": "3.6.0"})
    assert meta._load_fla_configs(tmp_path / "gpu.json") is None and not tuner.cache
