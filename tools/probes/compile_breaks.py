"""Does the graph memory's diffusion operator break Dynamo's graph on the GPU's torch, and what does
notebook 10's compile rung gain once it does not?

The H200 reference at b0bf60d (torch 2.11) counted five "Data-dependent branching (memory.py:144)" breaks
in notebook 04's two-layer model, at ``with off or contextlib.nullcontext():``; torch 2.13 on a CPU counts
none. This probe explains that model (bf16, 2 x 16 tokens, as notebook 04 does) with the operator of
b0bf60d and with the current one, then times notebook 10's bf16 rung against its compile rung (the
training step at batch x 1024 tokens, eager time: back-to-back steps, median and 20-80%).

    source .whl/env.sh && python3 tools/probes/compile_breaks.py [batch]     # on the GPU; batch default 16
"""

import contextlib
import os
import sys
import time
import warnings
from collections import Counter

import torch

import mahia.model.memory as memory
from mahia.lessons.full_stack import build, climb
from mahia.measure.timing import bench
from mahia.model import HybridConfig, HybridModel
from mahia.model.data import SyntheticTokens

T0 = time.perf_counter()


def log(*args) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s]", *args, flush=True)


def operator_b0bf60d(adj_logits, steps, alpha):
    """The diffusion operator as b0bf60d wrote it (checks left out): the ``or`` on a context manager."""
    n = adj_logits.shape[0]
    compute_dtype = torch.promote_types(adj_logits.dtype, torch.float32)
    eye = torch.eye(n, device=adj_logits.device, dtype=compute_dtype)
    p = (1.0 - alpha) * eye + alpha * torch.softmax(adj_logits.to(compute_dtype), dim=-1)
    off = torch.autocast(adj_logits.device.type, enabled=False) if adj_logits.device.type in ("cuda", "cpu") else None
    with off or contextlib.nullcontext():
        result = None
        while steps:
            if steps & 1:
                result = p if result is None else result @ p
            steps >>= 1
            if steps:
                p = p @ p
    return (eye if result is None else result).to(adj_logits.dtype)


def explain(dev) -> tuple[int, int, list]:
    """Notebook 04's explain of the fast two-layer model: graphs, breaks, the most frequent reasons."""
    torch.manual_seed(0)
    c = HybridConfig.preset("small").optimized().replace(kernels="eager")
    m = HybridModel(c.replace(n_layers=2, moe_every=2, memory_every=2)).to(device=dev, dtype=torch.bfloat16).eval()
    i = torch.randint(0, c.vocab_size, (2, 16), device=dev)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m(i)
        ex = torch._dynamo.explain(m)(i)
    where = Counter()
    for r in ex.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        loc = f"{os.path.basename(frame.filename)}:{frame.lineno}" if frame else "?"
        where[f"{r.reason.strip().splitlines()[0]} ({loc})"] += 1
    torch._dynamo.reset()
    return ex.graph_count, ex.graph_break_count, where.most_common(3)


def main() -> None:
    dev = torch.device("cuda")
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    log(f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    rows = []
    current = memory.diffusion_operator
    for label, op in (("b0bf60d operator", operator_b0bf60d), ("current operator", current)):
        memory.diffusion_operator = op
        graphs, breaks, top = explain(dev)
        rows.append(f"{label}: {graphs} graph(s), {breaks} break(s); {top or '-'}")
        log(rows[-1])
    memory.diffusion_operator = current

    cfg = HybridConfig.preset("small")
    data = SyntheticTokens(cfg.vocab_size, 1024, seed=0)
    fixed = data.batch(batch, dev)
    torch.manual_seed(0)
    with dev:
        state = {k: v.detach().clone() for k, v in HybridModel(cfg.baseline()).state_dict().items()}
    stacks = dict(climb())
    times = {}
    for name in ("bf16", "compile"):
        b = build(cfg, stacks[name], device=dev, state=state)
        t0 = time.perf_counter()
        b.step(fixed)
        torch.cuda.synchronize()
        log(f"{name}: first step {time.perf_counter() - t0:.1f} s (compiles, for the compile rung)")
        times[name] = bench(lambda step=b.step: step(fixed), rep_ms=2000, warmup_ms=300)
        t = times[name]
        log(f"{name}: {t.median_ms:.1f} ms per step (20-80%: {t.p20_ms:.1f}-{t.p80_ms:.1f}, n={t.n})")
        del b
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    ratio = times["bf16"].median_ms / times["compile"].median_ms
    rows.append(
        f"step at {batch} x 1024 tokens: bf16 eager {times['bf16'].median_ms:.1f} ms, + compile "
        f"{times['compile'].median_ms:.1f} ms: x{ratio:.2f}"
    )
    print("\n".join(["", "summary:"] + rows), flush=True)


if __name__ == "__main__":
    main()
