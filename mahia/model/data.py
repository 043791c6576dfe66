"""A synthetic, learnable token stream, generated on the device (no downloads, no host syncs).

The source is a first-order Markov chain over ``V`` tokens built from two fixed random objects (seeded):
a Zipf unigram distribution ``z`` (over a random ordering of the vocabulary) and a random permutation
``succ`` of the vocabulary. Each token is

    x_0 ~ z
    x_t = succ(x_{t-1})   with probability p       ("copy": the chain follows its permutation)
        ~ z               with probability 1 - p   ("fresh": a new draw from the unigram)

so  P(x_t = v | x_{t-1} = u) = p [v = succ(u)] + (1 - p) z_v.  A model learns the unigram first (the loss
falls from ln V to about H(z) in a few steps), then the bigram structure, down to the loss floor

    floor = (1/T) sum_{t=1..T} sum_u m_{t-1}(u) H(p delta_succ(u) + (1 - p) z),
    m_0 = z,  m_t = p succ_#(m_{t-1}) + (1 - p) z       (the marginal of x_t; succ_# pushes it forward)

which is the exact expected cross entropy of the Bayes-optimal predictor over the ``T`` targets of a batch
(``entropy()``). No model can average below it; a good one gets close.

Generation is parallel over time, so a batch costs a handful of kernels rather than ``T`` of them: with
``s_t`` the last fresh position at or before ``t`` (a ``cummax``) and ``k = t - s_t`` copies since,
``x_t = succ^k(z-draw at s_t)``. Powers of a permutation are cheap through its cycles: if ``u`` sits at
index ``i`` of a cycle of length ``L`` stored at ``cycles[start : start + L]``, then
``succ^k(u) = cycles[start + (i + k) mod L]``. Random numbers come from a ``torch.Generator`` on the
target device; sampling is inverse-CDF (``searchsorted``), so nothing waits for the host.
"""

from __future__ import annotations

import math

import torch

from mahia.measure.checks import check_int

__all__ = ["SyntheticTokens"]


class SyntheticTokens:
    """Batches ``(idx, targets)`` of shape (B, seq_len) from the seeded Markov source described above.

    ``targets`` is ``idx`` shifted left by one (the next token). The same ``seed`` gives the same source
    (``z``, ``succ``) and the same stream of batches per device.
    """

    def __init__(
        self, vocab_size: int, seq_len: int, seed: int = 0, *, copy_prob: float = 0.5, zipf_exponent: float = 1.0
    ):
        check_int("SyntheticTokens", "vocab_size", vocab_size, minimum=2)
        check_int("SyntheticTokens", "seq_len", seq_len)
        check_int("SyntheticTokens", "seed", seed, minimum=-(2**63))
        for name, v, ok in (("copy_prob", copy_prob, "in [0, 1)"), ("zipf_exponent", zipf_exponent, ">= 0")):
            if not (isinstance(v, (int, float)) and 0.0 <= v < (1.0 if name == "copy_prob" else math.inf)):
                raise ValueError(f"SyntheticTokens: {name} must be {ok}, got {v!r}")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.copy_prob, self.zipf_exponent = float(copy_prob), float(zipf_exponent)

        g = torch.Generator().manual_seed(seed)
        ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
        zipf = ranks.pow(-self.zipf_exponent)
        order = torch.randperm(vocab_size, generator=g)  # token order[r] has rank r + 1
        z = torch.empty(vocab_size, dtype=torch.float64)
        z[order] = zipf / zipf.sum()
        self.unigram = z  # (V,) float64, sums to 1
        self.succ = torch.randperm(vocab_size, generator=g)  # (V,) the permutation

        # Cycle tables of succ: cycles (V,) lists the cycles one after another; for each token u its
        # cycle's start offset, length, and u's index inside the cycle.
        succ = self.succ.tolist()
        seen = [False] * vocab_size
        cycles, start, length, index = [], [0] * vocab_size, [0] * vocab_size, [0] * vocab_size
        for u0 in range(vocab_size):
            if seen[u0]:
                continue
            cyc, u = [], u0
            while not seen[u]:
                seen[u] = True
                cyc.append(u)
                u = succ[u]
            for i, u in enumerate(cyc):
                start[u], length[u], index[u] = len(cycles), len(cyc), i
            cycles.extend(cyc)
        self._tables_cpu = {
            "cycles": torch.tensor(cycles, dtype=torch.int64),
            "start": torch.tensor(start, dtype=torch.int64),
            "length": torch.tensor(length, dtype=torch.int64),
            "index": torch.tensor(index, dtype=torch.int64),
            "cdf": torch.cumsum(z, 0).to(torch.float32),
        }
        self._tables: dict[torch.device, dict[str, torch.Tensor]] = {}
        self._generators: dict[torch.device, torch.Generator] = {}

    def _on(self, device: torch.device) -> tuple[dict[str, torch.Tensor], torch.Generator]:
        if device not in self._tables:
            self._tables[device] = {k: v.to(device) for k, v in self._tables_cpu.items()}
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._tables[device], self._generators[device]

    def batch(self, batch_size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(idx, targets)``, each (batch_size, seq_len) int64 on ``device``; no host synchronisation."""
        check_int("SyntheticTokens.batch", "batch_size", batch_size)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        tab, gen = self._on(device)
        n = self.seq_len + 1
        shape = (batch_size, n)
        # Fresh unigram draws by inverse CDF; clamp guards the float32 cdf ending just below 1.
        u = torch.rand(shape, generator=gen, device=device)
        fresh_tok = torch.searchsorted(tab["cdf"], u).clamp_(max=self.vocab_size - 1)  # (B, n)
        is_fresh = torch.rand(shape, generator=gen, device=device) >= self.copy_prob  # (B, n)
        is_fresh[:, 0] = True  # x_0 ~ z
        t = torch.arange(n, device=device).expand(shape)
        last_fresh = torch.where(is_fresh, t, torch.zeros_like(t)).cummax(dim=1).values  # (B, n): s_t
        k = t - last_fresh  # copies since the last fresh draw
        root = fresh_tok.gather(1, last_fresh)  # (B, n): the token drawn at s_t
        pos = tab["start"][root] + (tab["index"][root] + k) % tab["length"][root]
        x = tab["cycles"][pos]  # (B, n): succ^k(root)
        return x[:, :-1], x[:, 1:]

    def entropy(self) -> float:
        """The loss floor in nats per token: the Bayes-optimal cross entropy averaged over the T targets."""
        p, z, succ = self.copy_prob, self.unigram, self.succ
        # Entropy of the next-token distribution after u: mass q = p + (1-p) z[succ u] on succ(u), the
        # rest (1-p) z_v spread over v != succ(u).
        fresh = (1.0 - p) * z
        plogp = torch.where(fresh > 0, fresh * fresh.log(), torch.zeros_like(fresh))
        total = -plogp.sum()
        fs = fresh[succ]  # (V,) the fresh mass on succ(u), for each u
        q = p + fs
        h_next = total + torch.where(fs > 0, fs * fs.log(), torch.zeros_like(fs)) - q * q.log()  # (V,)
        m, acc = z.clone(), 0.0
        for t in range(self.seq_len):
            h_t = float((m * h_next).sum())
            acc += h_t
            pushed = torch.zeros_like(m)
            pushed[succ] = m  # mass at u moves to succ(u)
            m_next = p * pushed + fresh
            if torch.equal(m_next, m):  # converged (the gap shrinks like p^t): the rest repeat h_t
                acc += h_t * (self.seq_len - t - 1)
                break
            m = m_next
        return acc / self.seq_len
