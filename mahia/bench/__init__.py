"""Benchmarks outside the notebooks: ``python -m mahia.bench <suite> [--quick]``.

Each suite module has ``run(recorder, ceilings, *, quick)`` and records through ``mahia.measure.results``,
so its numbers land in ``data/results/<device>/bench_<suite>.csv`` and feed ``summary.json``.
"""

SUITES = {
    "kernels": "mahia.bench.kernels",  # RMSNorm, SwiGLU, RoPE, MoE combine against eager, compile, Liger
    "moe": "mahia.bench.moe",  # MoE loop against grouped matmul
    "meta": "mahia.bench.meta",  # MetaAttention loop / log-space / Triton scan
    "hybrid": "mahia.bench.hybrid_parts",  # graph memory, gating, momentum update
}
