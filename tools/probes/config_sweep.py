# ruff: noqa: B023  (each closure is timed within its own loop iteration)
"""Launch configurations per shape (issue 13, device time at every shape): for each kernel and sweep
shape, the device time of every candidate configuration beside the current choice and the best peer.

    source .whl/env.sh && python3 tools/probes/config_sweep.py [rmsnorm_fwd rmsnorm_bwd swiglu rope]

Device time: ``mahia.measure.timing.bench(cuda_graph=True)`` (CUDA-graph replay, L2 flushed), as the
kernel benchmark times it. The full table goes to $OUT/config_sweep.json; the log keeps one line per shape.
"""

import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
from _probe import Probe

from mahia.measure.timing import bench
from mahia.ops import rmsnorm as R
from mahia.ops import rope as P
from mahia.ops import swiglu as S

DEV = torch.device("cuda")
EPS = 1e-6
ROWS = (1024, 4096, 16384)


def t_ms(fn) -> float:
    return bench(fn, device=DEV, cuda_graph=True, warmup_ms=5, rep_ms=25, memory=False).median_ms


def best(table: dict) -> tuple:
    k = min(table, key=table.get)
    return k, table[k]


def peers_rmsnorm(x, w):
    out = {"F.rms_norm": t_ms(lambda: F.rms_norm(x, (x.shape[-1],), w, EPS))}
    torch._dynamo.reset()
    comp = torch.compile(lambda x, w: R.rms_norm_eager(x, w, EPS), dynamic=False)
    comp(x, w)
    out["torch.compile"] = t_ms(lambda: comp(x, w))
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        out["liger"] = t_ms(lambda: LigerRMSNormFunction.apply(x, w, EPS))
    except Exception as exc:
        print("liger rmsnorm:", exc)
    return out


def rmsnorm_fwd(p: Probe, rec: list, dtype) -> None:
    for n, m in itertools.product((1000, 2048, 4096, 5120, 8192), ROWS):
        x = torch.randn(m, n, device=DEV, dtype=dtype)
        w = torch.randn(n, device=DEV, dtype=dtype)
        _, block_n, _ = R.fwd_config(n)
        cur = R.fwd_config(n)
        table = {}
        for bm, nw in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8, 16)):
            if bm * block_n > 16384 or bm * block_n < 512 or nw * 32 > bm * block_n:
                continue
            table[(bm, nw)] = t_ms(lambda: R.rms_norm_fwd_launch(x, w, None, EPS, block_m=bm, num_warps=nw))
        peers = peers_rmsnorm(x, w)
        now = table.get((cur[0], cur[2])) or t_ms(lambda: R.rms_norm_fwd_launch(x, w, None, EPS))
        k, v = best(table)
        pk, pv = best(peers)
        p.log(
            f"rmsnorm_fwd {dtype} {m}x{n}: now {cur} {now * 1e3:.1f} us; best {k} {v * 1e3:.1f}; {pk} {pv * 1e3:.1f}; now/peer {pv / now:.3f} best/peer {pv / v:.3f}"
        )
        rec.append(
            dict(
                kernel="rmsnorm_fwd",
                dtype=str(dtype),
                shape=[m, n],
                now=now,
                table={str(a): b for a, b in table.items()},
                peers=peers,
            )
        )


def rmsnorm_bwd(p: Probe, rec: list, dtype) -> None:
    for n, m in itertools.product((1000, 2048, 4096, 5120, 8192), ROWS):
        x = torch.randn(m, n, device=DEV, dtype=dtype)
        w = torch.randn(n, device=DEV, dtype=dtype)
        dy = torch.randn_like(x)
        _, block_n, _, _ = R.bwd_config(n)
        cur = R.bwd_config(n)
        table = {}
        for bm, nw, ps in itertools.product((1, 2, 4, 8), (4, 8, 16), (1, 2, 4)):
            if bm * block_n > 16384 or nw * 32 > bm * block_n:
                continue
            table[(bm, nw, ps)] = t_ms(
                lambda: R.rms_norm_bwd_launch(dy, x, w, EPS, None, block_m=bm, num_warps=nw, programs_per_sm=ps)
            )
        now = table.get((cur[0], cur[2], cur[3])) or t_ms(lambda: R.rms_norm_bwd_launch(dy, x, w, EPS, None))
        k, v = best(table)
        p.log(
            f"rmsnorm_bwd {dtype} {m}x{n}: now {cur} {now * 1e3:.1f} us; best {k} {v * 1e3:.1f}; now/best {v / now:.3f}"
        )
        rec.append(
            dict(
                kernel="rmsnorm_bwd",
                dtype=str(dtype),
                shape=[m, n],
                now=now,
                table={str(a): b for a, b in table.items()},
            )
        )


def swiglu(p: Probe, rec: list, dtype) -> None:
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction as L
    except Exception as exc:
        print("liger swiglu:", exc)
        L = None
    for m, n in (
        (1024, 2048),
        (1024, 4096),
        (1024, 11008),
        (4096, 1000),
        (4096, 2048),
        (4096, 4096),
        (16384, 1000),
        (16384, 2048),
    ):
        a = torch.randn(m, n, device=DEV, dtype=dtype, requires_grad=True)
        b = torch.randn(m, n, device=DEV, dtype=dtype, requires_grad=True)
        dc = torch.randn(m, n, device=DEV, dtype=dtype)
        cur = S._config(m * n)  # contiguous operands are one row of m*n elements
        fwd, bwd = {}, {}
        for blk, nw in itertools.product((256, 512, 1024, 2048, 4096), (1, 2, 4, 8, 16)):
            if nw * 32 > blk or blk // (nw * 32) > 32:
                continue
            fwd[(blk, nw)] = t_ms(lambda: S.swiglu_fwd_launch(a, b, block=blk, num_warps=nw))
            bwd[(blk, nw)] = t_ms(lambda: S.swiglu_bwd_launch(dc, a, b, block=blk, num_warps=nw))
        peers = {}
        if L is not None:
            a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
            peers["liger_fwd"] = t_ms(lambda: L.apply(a2, b2))
            peers["liger_fwdbwd"] = t_ms(lambda: torch.autograd.grad(L.apply(a2, b2), (a2, b2), dc))
        for name, table in (("fwd", fwd), ("bwd", bwd)):
            k, v = best(table)
            now = table.get(cur)
            p.log(
                f"swiglu_{name} {dtype} {m}x{n}: now {cur} {now * 1e3:.1f} us; best {k} {v * 1e3:.1f}; now/best {v / now:.3f}"
            )
        if peers:
            nf, nb = fwd[cur], bwd[cur]
            bf, bb = best(fwd)[1], best(bwd)[1]
            p.log(
                f"   liger fwd {peers['liger_fwd'] * 1e3:.1f} fwdbwd {peers['liger_fwdbwd'] * 1e3:.1f}; mahia now fwd+bwd {(nf + nb) * 1e3:.1f}, best {(bf + bb) * 1e3:.1f}"
            )
        rec.append(
            dict(
                kernel="swiglu",
                dtype=str(dtype),
                shape=[m, n],
                now=cur,
                fwd={str(a): b for a, b in fwd.items()},
                bwd={str(a): b for a, b in bwd.items()},
                peers=peers,
            )
        )


def rope(p: Probe, rec: list, dtype) -> None:
    try:
        from liger_kernel.ops.rope import LigerRopeFunction as L
    except Exception as exc:
        print("liger rope:", exc)
        L = None
    for (B, T), (hq, hk, d) in itertools.product(
        ((1, 1024), (2, 2048), (8, 2048)), ((12, 12, 64), (28, 4, 128), (32, 8, 128), (40, 40, 128), (64, 8, 128))
    ):
        q = torch.randn(B, T, hq, d, device=DEV, dtype=dtype)
        k = torch.randn(B, T, hk, d, device=DEV, dtype=dtype)
        ang = torch.randn(T, d // 2, device=DEV)
        cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
        table = {nw: t_ms(lambda: P.rope_launch(q, k, cos, sin, num_warps=nw)) for nw in (1, 2, 4, 8, 16)}
        bq = 1 << (hq - 1).bit_length()
        cur = P._num_warps(bq, 1 << (d // 2 - 1).bit_length())
        peer = None
        if L is not None:
            c2, s2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
            qt, kt = q.transpose(1, 2), k.transpose(1, 2)
            peer = t_ms(lambda: L.apply(qt, kt, c2, s2))
        k_, v = best(table)
        now = table[cur]
        p.log(
            f"rope {dtype} {B}x{T}x{hq}x{hk}x{d}: now {cur} warps {now * 1e3:.1f} us; best {k_} {v * 1e3:.1f}; liger {peer * 1e3 if peer else float('nan'):.1f}; now/peer {(peer or 0) / now:.3f} best/peer {(peer or 0) / v:.3f}"
        )
        rec.append(
            dict(
                kernel="rope",
                dtype=str(dtype),
                shape=[B, T, hq, hk, d],
                now=cur,
                table={str(a): b for a, b in table.items()},
                liger=peer,
            )
        )


def main() -> None:
    parts = sys.argv[1:] or ["rmsnorm_fwd", "rmsnorm_bwd", "swiglu", "rope"]
    p = Probe(DEV)
    rec: list = []
    for part in parts:
        name, _, dt = part.partition(":")
        dtype = {"": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
        globals()[name](p, rec, dtype)
        p.lap()
        with open(os.path.join(os.environ.get("OUT", "."), "config_sweep.json"), "w") as f:
            json.dump(rec, f)
    p.finish()


if __name__ == "__main__":
    main()
