"""What the GPU probes in this folder share: the measured ceilings, a log that flushes (the device tool
returns only the tail of the output, so lines must not sit in a buffer), lap times, and a summary
printed last.

    from _probe import Probe          # python3 tools/probes/<probe>.py puts this folder on sys.path
    p = Probe(torch.device("cuda"))   # measures (or reads) the ceilings into $OUT/probe_results
    p.log(...); p.summary.append(...); p.lap(); p.finish()
"""

import os
import time

import torch

from mahia.measure import hardware


class Probe:
    def __init__(self, dev: torch.device):
        self.t0 = time.perf_counter()
        self.summary: list[str] = []
        self.ceil = hardware.ceilings(dev, results_dir=os.path.join(os.environ.get("OUT", "."), "probe_results"))
        self.log(
            f"{hardware.device_slug(dev)}: copy {self.ceil.copy_gbps:.0f} GB/s, bf16 "
            f"{self.ceil.matmul_bf16_tflops:.0f} TFLOP/s (measured), torch {torch.__version__}"
        )

    @staticmethod
    def log(*args) -> None:
        print(*args, flush=True)

    def lap(self) -> None:
        """The seconds since the probe started."""
        self.log(f"[{time.perf_counter() - self.t0:.0f} s]")

    def finish(self) -> None:
        self.log("\nSUMMARY")
        for line in self.summary:
            self.log(" ", line)
        self.log(f"total {time.perf_counter() - self.t0:.0f} s")
