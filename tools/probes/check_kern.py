"""Quick agreement of the edited kernels with the eager references (bf16 and fp32, odd shapes)."""

import torch

from mahia import ops
from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager
from mahia.ops.rope import apply_rope_eager

dev = "cuda" if torch.cuda.is_available() else "cpu"
for dt in (torch.float32, torch.bfloat16):
    tol = 1e-5 if dt == torch.float32 else 2e-2
    for m, n in ((3, 1000), (7, 5120), (5, 24), (129, 1000)):
        x = torch.randn(m, n, device=dev, dtype=dt, requires_grad=True)
        r = torch.randn(m, n, device=dev, dtype=dt, requires_grad=True)
        w = torch.randn(n, device=dev, dtype=dt, requires_grad=True)
        for fn, ref, args in (
            (ops.rms_norm, rms_norm_eager, (x, w)),
            (ops.add_rms_norm, add_rms_norm_eager, (x, r, w)),
        ):
            out = fn(*args)
            exp = ref(*args)
            outs, exps = (out, exp) if isinstance(out, tuple) else ((out,), (exp,))
            g = [torch.randn_like(o) for o in outs]
            ga = torch.autograd.grad(outs, args, g)
            gb = torch.autograd.grad(exps, args, g)
            for a, b in zip(outs + ga, exps + gb):
                err = ((a.double() - b.double()).norm() / b.double().norm()).item()
                assert err < tol, (fn.__name__, dt, m, n, err)
    for B, T, hq, hk, d in ((2, 5, 3, 1, 64), (1, 7, 12, 12, 64), (2, 3, 4, 2, 128)):
        q = torch.randn(B, T, hq, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(B, T, hk, d, device=dev, dtype=dt, requires_grad=True)
        ang = torch.randn(T, d // 2, device=dev)
        cos, sin = ang.cos().to(dt), ang.sin().to(dt)
        out, exp = ops.rope(q, k, cos, sin), apply_rope_eager(q, k, cos, sin)
        g = [torch.randn_like(o) for o in out]
        for a, b in zip(out + torch.autograd.grad(out, (q, k), g), exp + torch.autograd.grad(exp, (q, k), g)):
            err = ((a.double() - b.double()).norm() / b.double().norm()).item()
            assert err < tol, ("rope", dt, B, T, hq, hk, d, err)
print("kernels agree with eager on", dev)
