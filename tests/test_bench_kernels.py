"""mahia.bench.kernels: the byte counts and the size-matched copy that bounds a memory-bound kernel."""
import torch

from mahia.measure import hardware

from mahia.measure import results
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


def test_moe_combine_byte_counts():
    """N=4 tokens, k=2, D=8 in bf16, gates float32, index int64, counted tensor by tensor."""
    out, y, gates, index = 4 * 2 * 8 * 2, 4 * 8 * 2, 4 * 2 * 4, 4 * 2 * 8
    fwd = out + y + gates + index                           # read out, gates, index; write y
    bwd = y + out + out + gates + index + gates             # read dy, out, gates, index; write d_out, d_gates
    assert min_bytes("moe_combine_fwd", (4, 2, 8), torch.bfloat16) == fwd
    assert min_bytes("moe_combine_fwdbwd", (4, 2, 8), torch.bfloat16) == fwd + bwd
