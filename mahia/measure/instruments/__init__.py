"""Dispatch-mode instruments: what a region of eager PyTorch code does, op by op, on any device.

    count_syncs        host-device synchronizations (:class:`SyncReport`)
    count_ops          ops that launch a kernel, plus Triton kernels launched from Python (:class:`OpCount`)
    LiveTensorMemory   bytes of tensor storage created inside and still alive, and their peak
    trace_ops          every op with its kind, bytes and FLOPs (:class:`OpTrace`), and an ideal fusion
                       estimate (:meth:`OpTrace.fused`)
    ByteTraffic        one row per kernel-launching op: bytes read and written, output shape
    float32_matmuls    the matrix products with a float32 output (those that make Inductor suggest TF32)

Eager code only: a compiled region's kernels skip the dispatcher, and a custom op is one op. A Triton
kernel launched from Python is seen only through Triton's launch hook (not under the CPU interpreter).

**Which ops launch a kernel** (:func:`launches_kernel`): every op, except views, :data:`NO_KERNEL_OPS`
(allocations, aliases, size queries, ``.item()``), profiler markers, and ops that neither return nor write
a tensor. A tensor's bytes are those of its distinct elements: a broadcast (stride-0) dimension counts once.

**Syncs.** The CPU waits for the GPU when it reads a value (``.item()``, ``if t > 0:``), when an output's
shape depends on the data (``nonzero``, ``x[mask]``, ``unique``) or on a copy to the host. ``syncing_ops``
counts the ATen ops that would sync on a GPU (on a CPU too); on CUDA ``cuda_syncs`` counts PyTorch's own
``set_sync_debug_mode("warn")`` warnings (a lower bound). ``count`` is the CUDA count where the region
ran CUDA ops, the op count elsewhere.

**Op traces.** Kinds: ``matmul`` (``2 m k n`` FLOPs; attention ``2 B H T S (D + Dv)``, halved when causal),
``opaque`` (custom ops, sorts, ``topk``, fused optimizer steps), ``pointwise`` (every other launching op:
what a compiler fuses) and ``free``. The fusion estimate merges pointwise ops joined by a data edge into
one kernel unless a matmul or opaque op lies between them (their *level* differs); a region reads each
outside tensor once and writes only what leaves it.
"""

from mahia.measure.instruments.counts import (
    NO_KERNEL_OPS,
    SYNCING_OPS,
    ByteTraffic,
    LiveTensorMemory,
    OpCount,
    SyncReport,
    count_ops,
    count_syncs,
    launches_kernel,
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

__all__ = [
    "NO_KERNEL_OPS",
    "launches_kernel",
    "SYNCING_OPS",
    "SyncReport",
    "count_syncs",
    "OpCount",
    "count_ops",
    "LiveTensorMemory",
    "MATMUL_OPS",
    "OPAQUE_ATEN_OPS",
    "OpRecord",
    "FusedEstimate",
    "OpTrace",
    "trace_ops",
    "ByteTraffic",
    "FLOAT32_MATMUL_OPS",
    "Float32Product",
    "Float32Matmuls",
    "float32_matmuls",
]
