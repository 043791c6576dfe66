"""Does the bf16 loss gap of notebook 06 come from routing decisions taken on bf16 logits?

    source .whl/env.sh && python3 tools/probes/amp_routing.py      # on the lent GPU, ~2 minutes

Notebook 06's setting (small preset, optimized impls, batch 16 x 1024, 200 AdamW steps at lr 1e-3 with a
20-step linear warmup, the same batches for every run): one fp32 run (TF32 off), and bf16 autocast
runs twice each with the routing decisions (MoE router, fabric gates) in bf16, as autocast made them
before, and in float32, as now. Prints each run's mean loss over the last 10% of steps and its
relative difference from fp32 (notebook 06's ``amp_loss`` metric), and the bf16 repeat's difference
from the first bf16 run (the run-to-run spread). Records nothing in data/.
"""
import time

import torch
import torch.nn.functional as F

import mahia.model.fabric as fabric_mod
from mahia.model import HybridConfig, HybridModel, SyntheticTokens, make_train_step
from mahia.model.moe import MoE
from mahia.lessons.training import matmul_precision, tail_rel_diff, train_run

dev = torch.device("cuda")
T0 = time.perf_counter()
cfg = HybridConfig.preset("small").optimized()
STEPS, BATCH, SEQ, LR, WARMUP = 200, 16, 1024, 1e-3, 20

new_route, new_gates = MoE._route, fabric_mod.fabric_gates


def old_route(self, x2):  # the router as it was: its matmul under autocast (bf16)
    logits = x2 @ self.w_router
    probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    top_p, experts = probs.topk(self.top_k, dim=-1)
    gates = torch.ones_like(top_p) if self.top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    return probs, experts, gates


def old_gates(x, gate_weight, gate_bias, *, source="mean"):  # F.linear under autocast (bf16)
    dt = torch.promote_types(x.dtype, torch.float32)
    summary = x.mean(dim=1, dtype=dt) if source == "mean" else x[:, 0].to(dt)
    return torch.sigmoid(F.linear(summary, gate_weight.to(dt), gate_bias.to(dt)))


def run(amp, old):
    MoE._route, fabric_mod.fabric_gates = (old_route, old_gates) if old else (new_route, new_gates)
    try:
        torch.manual_seed(0)
        model = HybridModel(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
        step = make_train_step(model, opt, amp=amp)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / WARMUP))

        def warm(b):
            loss = step(b)
            sched.step()
            return loss

        with matmul_precision(False):
            curve = train_run(warm, SyntheticTokens(cfg.vocab_size, SEQ, seed=0), steps=STEPS, batch_size=BATCH,
                              device=dev).cpu()
    finally:
        MoE._route, fabric_mod.fabric_gates = new_route, new_gates
    print(f"{amp or 'fp32'} {'old (bf16 decisions)' if old else 'new (fp32 decisions)'}: tail "
          f"{curve[-STEPS // 10:].mean():.5f} [{time.perf_counter() - T0:.0f} s]", flush=True)
    return curve


fp32 = run(None, False)
runs = {}
for label, old in (("bf16 old", True), ("bf16 new", False), ("bf16 old (repeat)", True), ("bf16 new (repeat)", False)):
    runs[label] = run("bf16", old)
print("\nSUMMARY (relative difference of the mean loss over the last 10% of steps)")
for label, c in runs.items():
    print(f"  {label:20s} vs fp32: {tail_rel_diff(c, fp32):.4f}")
for k in ("old", "new"):
    print(f"  bf16 {k} repeat vs first: {tail_rel_diff(runs[f'bf16 {k} (repeat)'], runs[f'bf16 {k}']):.4f}")
print(f"total {time.perf_counter() - T0:.0f} s")
