"""mahia.bench.kernels: the byte counts and the size-matched copy that bounds a memory-bound kernel."""
import torch

from mahia import hardware, results
from mahia.bench.kernels import _copy_of_same_bytes, min_bytes


def test_copy_of_same_bytes_records_the_limit_at_that_size(tmp_path):
    slug = hardware.device_slug("cpu")
    ceil = hardware.Ceilings(slug, copy_gbps=10.0, matmul_bf16_tflops=1.0, matmul_fp32_tflops=1.0,
                             measured_at="now")
    rec = results.Recorder("99_test", "cpu", results_dir=tmp_path, ceilings=ceil)
    nbytes = min_bytes("rmsnorm_fwd", (64, 512), torch.bfloat16)
    _copy_of_same_bytes(rec, "rmsnorm_fwd", nbytes, (64, 512), torch.bfloat16)
    (row,) = rec.rows
    assert row["experiment"] == "rmsnorm_fwd" and row["variant"] == "copy_same_bytes"
    assert row["role"] == "metric" and row["value"] > 0
    mb = int(nbytes) // 8 * 8 / 1e6
    assert f"{mb:.0f} MB moved" in row["notes"]
