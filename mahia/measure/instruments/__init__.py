"""Dispatch-mode instruments: what a region of eager PyTorch code does, op by op, on any device.

    count_syncs        host-device synchronizations (:class:`SyncReport`)
    count_ops          ops that launch a kernel, plus Triton kernels launched from Python (:class:`OpCount`)
    LiveTensorMemory   bytes of tensor storage created inside and still alive, and their peak
    ByteTraffic        one row per kernel-launching op: bytes read and written, output shape
    trace_ops          every op with its kind, bytes and FLOPs (:class:`OpTrace`), and an ideal fusion
                       estimate (:meth:`OpTrace.fused`)
    float32_matmuls    the matrix products with a float32 output (those that make Inductor suggest TF32)

Eager code only: a compiled region's kernels skip the dispatcher, and a custom op is one op.
"""

# ruff: noqa: F401  (the names below are this package's interface)
from mahia.measure.instruments.counts import (
    NO_KERNEL_OPS,
    SYNCING_OPS,
    ByteTraffic,
    LiveTensorMemory,
    OpCount,
    SyncReport,
    count_ops,
    count_syncs,
)
from mahia.measure.instruments.trace import (
    FLOAT32_MATMUL_OPS,
    MATMUL_OPS,
    OPAQUE_ATEN_OPS,
    Float32Matmuls,
    Float32Product,
    FusedEstimate,
    OpRecord,
    OpTrace,
    float32_matmuls,
    trace_ops,
)
