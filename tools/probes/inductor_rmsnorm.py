"""The Triton code torch.compile generates for the eager RMSNorm forward at small shapes, and its launch
configuration (issue 13: where it beats mahia's kernel by 10-20% at 4-20 MB). Writes $OUT/inductor_rms.txt."""

import os

import torch
from torch._inductor.utils import run_and_get_code

from mahia.ops.rmsnorm import rms_norm_eager

out = []
for m, n in ((4096, 1000), (1024, 4096), (1024, 5120), (1024, 2048)):
    torch._dynamo.reset()
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    fn = torch.compile(lambda x, w: rms_norm_eager(x, w, 1e-6), dynamic=False)
    _, code = run_and_get_code(fn, x, w)
    out.append(f"===== {m}x{n}\n" + "\n".join(code))
with open(os.path.join(os.environ.get("OUT", "."), "inductor_rms.txt"), "w") as f:
    f.write("\n".join(out))
print("written", sum(len(c) for c in out), "chars")
