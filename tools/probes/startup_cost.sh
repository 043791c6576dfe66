#!/usr/bin/env bash
# Where a notebook's fixed cost goes on a lent GPU machine (issue 16: the quick profile within ten minutes):
# Python's start, each heavy import, CUDA's start, Liger-Kernel's import, papermill's kernel start, the first
# torch.compile of a process, and mahia's setup(). Each row is a fresh process, timed from the shell.
#   source .whl/env.sh && timeout 270 bash tools/probes/startup_cost.sh > $OUT/startup.log 2>&1
# (write to a file under $OUT: a command stopped at its limit returns no piped output). Records nothing.
set -u
cd "$(dirname "$0")/../.."
t() { local s=$(date +%s%N); timeout ${T:-25} "$@" > /tmp/o.txt 2>&1; local rc=$?; local e=$(date +%s%N); printf "%7d ms  rc=%d  %s\n" $(( (e - s) / 1000000 )) $rc "$*"; [ $rc = 0 ] || tail -3 /tmp/o.txt; }
export PYTHONPYCACHEPREFIX=/tmp/pyc
echo "== warm bytecode first"; T=60 t python3 -c "import torch, matplotlib.pyplot, pandas, mahia.lessons.triton_tutorial, mahia.lessons.notebook, ipykernel"
t python3 -c "pass"
t python3 -c "import torch"
t python3 -c "import torch; torch.zeros(1, device='cuda')"
t python3 -c "import ipykernel.kernelapp"
t python3 -c "import matplotlib.pyplot"
t python3 -c "import torch._dynamo"
t python3 -c "import mahia.lessons.triton_tutorial"
t python3 -c "import mahia.lessons.triton_tutorial as tu; tu.liger_ops()"
t python3 -c "import liger_kernel"
t python3 -c "from liger_kernel.ops.rms_norm import LigerRMSNormFunction"
t python3 -c "import transformers"
timeout 25 python3 -X importtime -c "import mahia.lessons.triton_tutorial as tu; tu.liger_ops()" 2> /tmp/it.txt; sort -t'|' -k2 -n /tmp/it.txt | tail -12
echo "== first torch.compile in a fresh process"
cat > /tmp/c1.py <<'P'
import time, torch
t0 = time.perf_counter()
f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1)
f(torch.randn(1024, device="cuda")); torch.cuda.synchronize()
t1 = time.perf_counter()
g = torch.compile(lambda x: torch.tanh(x) * 3 - 1)
g(torch.randn(2048, device="cuda")); torch.cuda.synchronize()
print(f"first compile {t1 - t0:.2f} s, second {time.perf_counter() - t1:.2f} s")
P
timeout 40 python3 /tmp/c1.py; TORCHINDUCTOR_COMPILE_THREADS=1 timeout 40 python3 /tmp/c1.py
echo "== setup() of a notebook, ceilings cached within a run"
cat > /tmp/s.py <<'P'
import time; t0 = time.perf_counter()
from mahia.lessons.notebook import setup
t1 = time.perf_counter()
ctx = setup("03_triton_fusion", device="auto", profile="quick", seed=0, results_dir="/tmp/res")
print(f"import {t1 - t0:.2f} s, setup {time.perf_counter() - t1:.2f} s")
P
MAHIA_RUN_ID=probe timeout 30 python3 /tmp/s.py 2>&1 | tail -1; MAHIA_RUN_ID=probe timeout 30 python3 /tmp/s.py 2>&1 | tail -1
echo "== papermill on a one-cell notebook"
python3 - <<'P'
import nbformat
nb = nbformat.v4.new_notebook(); nb.cells = [nbformat.v4.new_code_cell("x = 1")]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbformat.write(nb, "/tmp/empty.ipynb")
P
t python3 -m papermill /tmp/empty.ipynb /tmp/empty_out.ipynb --no-progress-bar
t python3 -m papermill /tmp/empty.ipynb /tmp/empty_out.ipynb --no-progress-bar
