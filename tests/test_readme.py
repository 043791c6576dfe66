"""The README's two Python examples run as a reader pastes them, in a fresh interpreter on the CPU (no Triton
interpreter: the Triton paths fall back to their PyTorch references)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.M | re.S)


def test_the_readme_has_the_package_and_the_model_examples():
    model = [b for b in BLOCKS if "HybridModel" in b]
    assert model and any("count_syncs" in b for b in BLOCKS), "the package or the model example is gone"
    for step in ("HybridConfig.preset(", ".backward()", ".optimized()", "apply_checkpointing(", "apply_compile("):
        assert step in model[0], f"the model example no longer shows {step}"
    assert all('device="cuda"' not in b for b in BLOCKS), "a snippet hard-codes CUDA"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_on_the_cpu(code, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with a GPU
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip(), "the example printed nothing"
