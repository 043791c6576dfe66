"""Compile the gated-linear-attention scan kernels for sm_90 ahead of time (no GPU needed) and write their SASS.

    python tools/probes/scan_sass.py <checkout> <out_dir>

Line info is off, so two checkouts whose kernels compile to the same machine code write identical files
(compare them with cmp). Six configurations of (dtype, BK, BV), the ones the launcher picks. Used to
check that a refactor of mahia/ops/gla_scan/kernels.py changes no instruction before it is timed on a GPU.
Prints one line per kernel: name, shared memory bytes, a hash of the SASS, its line count.
"""

import hashlib
import os
import subprocess
import sys
import tempfile

os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
os.environ["TRITON_DEFAULT_FP_FUSION"] = "1"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, sys.argv[1])
from mahia.ops.gla_scan import kernels as scan

out = sys.argv[2]
os.makedirs(out, exist_ok=True)
target = GPUTarget("cuda", 90, 32)
cfgs = [("bf16", 16, 64), ("bf16", 64, 64), ("bf16", 128, 64), ("fp32", 32, 32), ("fp32", 64, 16), ("fp16", 64, 64)]
for dt, bk, bv in cfgs:
    p = "*" + dt
    prec = "ieee" if dt == "fp32" else "tf32"
    warps = 4 if bk == 16 else 8
    for name, fn, sig in (
        (
            "fwd",
            scan._gla_fwd_kernel,
            {"Q": p, "K": p, "V": p, "G": p, "O": p, "seq_len": "i32", "k_dim": "i32", "v_dim": "i32"},
        ),
        (
            "bwd",
            scan._gla_bwd_kernel,
            {
                "Q": p,
                "K": p,
                "V": p,
                "G": p,
                "DO": p,
                "DQ": "*fp32",
                "DK": "*fp32",
                "DV": p,
                "DG": "*fp32",
                "HS": "*fp32",
                "seq_len": "i32",
                "k_dim": "i32",
                "v_dim": "i32",
                "n_bh": "i32",
            },
        ),
    ):
        const = {"BT": 16, "BK": bk, "BV": bv, "PRECISION": prec, "UPCAST": False, "RESET": scan.RESET}
        for c in const:
            sig[c] = "constexpr"
        src = ASTSource(fn=fn, signature=sig, constexprs={(list(sig).index(k),): v for k, v in const.items()})
        k = triton.compile(src, target=target, options={"num_warps": warps})
        cubin = k.asm["cubin"]
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(cubin)
        cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
        tag = f"{name}_{dt}_bk{bk}_bv{bv}"
        open(os.path.join(out, tag + ".sass"), "w").write(sass)
        print(
            tag,
            k.metadata.shared if hasattr(k.metadata, "shared") else "",
            hashlib.md5(sass.encode()).hexdigest()[:10],
            len(sass.splitlines()),
        )
