"""Kernel benchmarks: RMSNorm, add + RMSNorm, SwiGLU, RoPE and the MoE combine (``python -m mahia.bench kernels``).

Every kernel, forward and forward + backward, over the shapes of :func:`_grid` (rows 91 to 16384 tokens;
hidden sizes of GPT-2 to Llama-3 70B), in bfloat16, float16 and float32, beside the peers a user could call
instead. Each variant is checked against a float64 run of the eager reference before it is timed; a wrong
one is not timed and the suite ends with a ``CorrectnessError`` naming it.

    eager          the readable reference of mahia.ops (``*_eager``)    role "baseline" (and a peer)
    F.rms_norm     PyTorch's own RMSNorm                                role "peer"
    torch.compile  Inductor's fusion of the eager reference (CUDA)      role "peer"
    liger          Liger-Kernel, where installed (CUDA)                 role "peer"
    mahia_triton   mahia.ops                                            role "optimized"

Two timings of every step, in two experiments so a ratio never mixes them (:func:`timing_mode`):

    <kernel>_<pass>          device time: a CUDA-graph replay after an L2 flush (the kernels alone)
    <kernel>_<pass>_eager    N calls back to back, one synchronize, per-call time (:func:`eager_bench`):
                             what an eager model sees, the variants' samples interleaved
    <kernel>_host_<pass>     eager time on a 4 x 64 tensor: Python + dispatch + autograd + launch

Bytes are the fewest a kernel must move (:func:`min_bytes`: each input read once, each output written once):

    rmsnorm_fwd          read x, write y                                     2 MN + N elements
    rmsnorm_fwdbwd       + read x, dy; write dx; read w, write dw            5 MN + 3 N
    add_rmsnorm_fwd      read x, r; write y, h; read w                       4 MN + N
    add_rmsnorm_fwdbwd   + read dy, dh, h; write dx (= dr); read w, write dw  8 MN + 3 N
    swiglu_fwd           read a, b; write c                                  3 n
    swiglu_fwdbwd        + read dc, a, b; write da, db                       8 n
    rope_fwd             read q, k; write q, k; cos/sin once                 2 (|q| + |k|) + T D float32
    rope_fwdbwd          the same twice                                      4 (|q| + |k|) + 2 T D float32
    moe_combine_fwd      read out (N k, D), write y (N, D); gates, index     N k D + N D + 12 N k bytes
    moe_combine_fwdbwd   + read dy, out; write d_out, d_gates                3 N k D + 2 N D + 28 N k bytes

On CUDA, at shapes of at least 8 MB, a ``copy_`` of the same bytes is timed too (``copy_same_bytes``): the
honest ceiling at that size.

Parts resume (a lent GPU command lasts 10 minutes): ``host`` and ``<kernel>-<dtype>``; ``--part rmsnorm`` selects
every dtype of a kernel, ``--part bf16`` every kernel of a dtype, ``--part list`` prints the plan with each
part's minutes on an H100. A record already in the CSV for this commit and profile is not measured again
(``--fresh`` measures anyway). ``--quick``: two tiny shapes per kernel, float32, no compile, Liger, copy or
figures (a smoke test, not a performance figure).
"""

from mahia.bench.kernels.shapes import (
    GRID,
    HEADLINE,
    KERNELS,
    PARTS,
    PASSES,
    PEER_ROLES,
    QUICK_BUDGET,
    ROLE,
    Variant,
    eager_bench,
    eager_bench_interleaved,
    input_bytes,
    make_inputs,
    min_bytes,
    parse_args,
    select_parts,
    timing_mode,
)
from mahia.bench.kernels.summary import SUMMARY_STEM, newest_rows, plot, summary_keys, write_summary
from mahia.bench.kernels.sweep import run

__all__ = [
    "run",
    "newest_rows",
    "min_bytes",
    "input_bytes",
    "eager_bench",
    "eager_bench_interleaved",
    "parse_args",
    "select_parts",
    "PARTS",
    "GRID",
    "HEADLINE",
    "summary_keys",
    "PEER_ROLES",
    "timing_mode",
    "plot",
    "Variant",
    "make_inputs",
    "write_summary",
    "SUMMARY_STEM",
    "KERNELS",
    "PASSES",
    "ROLE",
    "QUICK_BUDGET",
]
