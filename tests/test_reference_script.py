"""tools/reference_run.sh: the commit every part of a reference records is spelled one way."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "reference_run.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("given", "recorded"),
    [
        ("b34185deecfdfc3f8e93fa89e416d2436000b430", "b34185deecfd"),
        ("b34185deecfdfc3f8e93fa89e416d2436000b430-dirty", "b34185deecfd-dirty"),
        ("b34185deecfd", "b34185deecfd"),  # already git's 12: unchanged
        ("0dea75a", "0dea75a"),  # a shorter abbreviation is kept as given
    ],
)
def test_full_sha_is_shortened_to_gits_twelve(tmp_path, given, recorded):
    # A stand-in Python that prints the MAHIA_COMMIT it was started with, for `-m mahia commit` and for the
    # device slug of the packing step; no part runs (param=... only), so nothing else is called.
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
