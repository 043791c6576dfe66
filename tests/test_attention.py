"""Attention paths (manual, SDPA per backend, chunked) against a float64 reference; the Attention layer
with its static KV cache (prefill == token-by-token decode, no host syncs while decoding); bad inputs."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mahia.layers import attention as A
from mahia.layers import kv_cache as KV
from mahia.layers.rope import RotaryCache
from mahia.measure.checks import check_close, compare_fn, tolerance
from mahia.measure.instruments import count_syncs
from mahia.measure.timing import capture_graph
from mahia.ops.rope import apply_rope_eager


def reference(q, k, v, causal=True, attn_mask=None):
    """Head by head, with the visibility rule spelled out: query i sees key j iff j <= i + S - T."""
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    visible = (j <= i + (S - T)) if causal else torch.ones(T, S, dtype=torch.bool, device=q.device)
    mask = None if attn_mask is None else attn_mask.expand(B, Hq, T, S)
    outs = []
    for h in range(Hq):
        kv = h // (Hq // Hkv)  # GQA: consecutive query heads share a kv head
        s = q[:, h] @ k[:, kv].transpose(-1, -2) / math.sqrt(D)  # (B, T, S)
        if mask is not None and mask.dtype == torch.bool:
            s = s.masked_fill(~mask[:, h], float("-inf"))
        elif mask is not None:
            s = s + mask[:, h].to(s.dtype)
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
        outs.append((p / p.sum(dim=-1, keepdim=True)) @ v[:, kv])
    return torch.stack(outs, dim=1)  # (B, Hq, T, Dv)


def qkv(B, Hq, Hkv, T, S, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g).to(dtype) for H, n in ((Hq, T), (Hkv, S), (Hkv, S)))


def paths(q, k, v, causal, attn_mask=None):
    """Every path under test, by name; the SDPA backends are those that can run on these inputs."""
    out = {
        "manual": lambda q, k, v: A.manual_attention(q, k, v, causal=causal, attn_mask=attn_mask),
        "chunked": lambda q, k, v: A.chunked_attention(q, k, v, causal=causal, chunk_size=16, attn_mask=attn_mask),
        "chunked-math": lambda q, k, v: A.chunked_attention(
            q, k, v, causal=causal, chunk_size=16, backend="math", attn_mask=attn_mask
        ),
        "sdpa-auto": lambda q, k, v: A.sdpa_attention(q, k, v, causal=causal, attn_mask=attn_mask),
    }
    for b in A.available_backends(q, k, v, causal=causal, attn_mask=attn_mask):
        out[f"sdpa-{b}"] = lambda q, k, v, b=b: A.sdpa_attention(q, k, v, causal=causal, attn_mask=attn_mask, backend=b)
    return out


# (B, Hq, Hkv, T, S, D): GQA, plain MHA with T = 130 > chunk, queries at the end of longer keys, decode
SHAPES = [(2, 6, 2, 37, 37, 16), (1, 4, 4, 130, 130, 24), (2, 6, 2, 7, 37, 16), (1, 6, 3, 1, 29, 8)]
CASES = [(s, c, torch.float32, None) for s in SHAPES for c in (True, False)] + [(SHAPES[0], True, torch.bfloat16, None)]
CASES += [((2, 6, 2, 11, 40, 16), c, torch.float32, m) for c in (True, False) for m in ("bool", "float")]


@pytest.mark.parametrize(
    "shape,causal,dtype,mask", CASES, ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c)
)
def test_paths_match_float64_reference(shape, causal, dtype, mask):
    """Every path, outputs and gradients, against the float64 head-by-head reference (for S > T: the
    last T rows of causal attention over all S keys, as decoding needs), with a user mask on top."""
    q, k, v = qkv(*shape, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    if mask == "bool":
        mask = torch.rand(2, 1, 11, 40, generator=g) > 0.3
        mask[..., 0] = True  # every query keeps at least key 0 (no all-masked row)
    elif mask == "float":
        mask = torch.randn(1, 6, 11, 40, generator=g)
    ref_mask = mask.double() if mask is not None and mask.is_floating_point() else mask
    ref = lambda q, k, v: reference(q, k, v, causal=causal, attn_mask=ref_mask)  # noqa: E731
    for name, fn in paths(q, k, v, causal, attn_mask=mask).items():
        compare_fn(fn, ref, [q, k, v], name=f"{name} {shape} causal={causal}", tol=tolerance(dtype))


# Issue 37 #4: SDPA and chunked(backend=...) cast a float mask to q's dtype: a float16 row of -1e5 became -inf (the
# row came back as zeros); a float32 bias near 300 kept 3 significant bits in bfloat16 (51% error).
@pytest.mark.parametrize(
    "dtype,offset,spread", [(torch.float16, -1e5, 0.0), (torch.bfloat16, 300.0, 2.0)], ids=["fp16-1e5", "bf16-300"]
)
def test_float_mask_with_a_large_offset_on_every_path(dtype, offset, spread):
    q, k, v = qkv(1, 2, 2, 8, 8, 16)
    mask = offset + spread * torch.randn(8, 8, generator=torch.Generator().manual_seed(3))  # float32
    ref = reference(q.double(), k.double(), v.double(), causal=True, attn_mask=mask.double())
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    for name, fn in paths(q, k, v, True, attn_mask=mask).items():
        check_close(f"{name} {dtype} mask {offset:g}", fn(q, k, v), ref, tolerance(dtype))


class _LargestScores(TorchDispatchMode):
    """Largest numel among op outputs whose last dim is S (score/probability-shaped tensors)."""

    def __init__(self, S):
        super().__init__()
        self.S, self.largest = S, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.S:
                self.largest = max(self.largest, t.numel())
        return out


def test_chunked_peak_score_memory_is_chunk_times_s():
    B, H, T, S, D, chunk = 1, 2, 130, 130, 8, 16
    q, k, v = qkv(B, H, H, T, S, D)
    with _LargestScores(S) as manual:
        A.manual_attention(q, k, v, causal=False)
    with _LargestScores(S) as chunked:
        A.chunked_attention(q, k, v, causal=False, chunk_size=chunk)
    assert manual.largest == B * H * T * S and chunked.largest == B * H * chunk * S


def test_dispatcher_and_backends_on_cpu():
    q, k, v = qkv(1, 4, 2, 19, 19, 8)
    ref = A.manual_attention(q, k, v)
    for impl, kw in (("sdpa", {}), ("sdpa", {"backend": "math"}), ("chunked", {"chunk_size": 4}), ("chunked", {})):
        check_close(f"attention(impl={impl}, {kw})", A.attention(q, k, v, impl=impl, **kw), ref, 1e-5)
    # PyTorch has a CPU kernel behind SDPBackend.FLASH_ATTENTION; cudnn and efficient are CUDA-only.
    assert A.available_backends(q, k, v) == ["flash", "math"]
    assert A.fused_backends(q, k, v) == ["flash"]
    for requested in ("efficient", "cudnn"):  # a CUDA-only backend falls back, with one warning
        A._warned.clear()
        with pytest.warns(RuntimeWarning, match=f"'{requested}' cannot run.*using 'flash'"):
            check_close(f"fallback from {requested}", A.sdpa_attention(q, k, v, backend=requested), ref, 1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the second call with the same kind of input stays quiet
            A.sdpa_attention(q, k, v, backend=requested)


def test_flops_and_bytes():
    assert A.attention_flops(2, 3, 5, 5, 4, causal=False) == 4 * 2 * 3 * 5 * 5 * 4
    assert 2 * A.attention_flops(2, 3, 6, 6, 4, causal=True) == A.attention_flops(2, 3, 6, 6, 4, causal=False)
    # S > T causal: the full T x S block minus the masked T x T/2 triangle at the end of the keys
    assert A.attention_flops(1, 1, 4, 10, 2, causal=True) == 4 * 2 * (4 * 10 - 4 * 4 // 2)
    q_out, kv = 2 * 2 * 8 * 16 * 64, 2 * 2 * 2 * 32 * 64  # elements of q + out, of k + v
    assert A.attention_bytes(2, 8, 2, 16, 32, 64, dtype=torch.bfloat16) == 2 * (q_out + kv)
    assert A.attention_bytes(1, 1, 1, 1, 1, 4, dtype=torch.float32) == 4 * (2 * 4 + 2 * 4)
    with pytest.raises(ValueError, match="S >= T"):
        A.attention_flops(1, 1, 8, 4, 2, causal=True)


@pytest.mark.parametrize(
    ("T", "S", "chunk", "causal"),
    [(10, 10, 4, True), (10, 13, 4, True), (10, 13, 4, False), (8, 8, 8, True), (8, 8, 20, True), (0, 5, 3, True)],
)
def test_chunk_blocks_are_the_blocks_chunked_attention_runs(monkeypatch, T, S, chunk, causal):
    seen = []
    manual = A.manual_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape[2], k.shape[2]))
        return manual(q, k, v, **kw)

    monkeypatch.setattr(A, "manual_attention", spy)
    A.chunked_attention(*qkv(1, 2, 2, T, S, 4), causal=causal, chunk_size=chunk)
    assert A.chunk_blocks(T, S, chunk, causal) == seen
    scores = {c: sum(r * s for r, s in A.chunk_blocks(64, 64, c)) for c in (8, 16, 32, 64)}
    assert scores == {c: 64 * (64 + c) // 2 for c in scores}  # about half the scores, more as the chunk grows
    assert sum(r * s for r, s in A.chunk_blocks(64, 64, 8, causal=False)) == 64 * 64


DIM, HQ, HKV, HD, B, T = 96, 6, 2, 16, 2, 13


def make_layer(impl="sdpa", **kw):
    torch.manual_seed(0)
    return A.Attention(DIM, HQ, HKV, impl=impl, **kw)


def layer_inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(B, T, DIM, generator=g), RotaryCache(HD, 32)


@pytest.mark.parametrize(
    "impl,kw",
    [("sdpa", {}), ("sdpa", {"backend": "math"}), ("manual", {}), ("chunked", {"chunk_size": 4})],
    ids=["sdpa", "sdpa-math", "manual", "chunked"],
)
@pytest.mark.parametrize("prefill", [0, 5], ids=["token-by-token", "prefill5"])
def test_layer_matches_reference_and_decodes_through_static_cache_without_host_syncs(impl, kw, prefill):
    """The layer against a float64 reference from its weights; a prefill, then token-by-token decoding
    through the static KV cache, gives the same output with no host sync."""
    layer, (x, rope) = make_layer(impl, **kw), layer_inputs()
    with torch.no_grad():
        full = layer(x, *rope.get(T))
        q, k, v = (x.double() @ layer.qkv_proj.weight.double().T).split([HQ * HD, HKV * HD, HKV * HD], dim=-1)
        q, k = apply_rope_eager(q.view(B, T, HQ, HD), k.view(B, T, HKV, HD), *rope.get(T))
        o = reference(q.transpose(1, 2), k.transpose(1, 2), v.view(B, T, HKV, HD).transpose(1, 2))
        check_close(
            "Attention layer", full, o.transpose(1, 2).reshape(B, T, -1) @ layer.out_proj.weight.double().T, 1e-5
        )
        cache = KV.StaticKVCache(B, 20, HKV, HD, device="cpu", dtype=torch.float32)
        outs, pos = [], 0
        for n in ([prefill] if prefill else []) + [1] * (T - prefill):
            xs, start = x[:, pos : pos + n], torch.tensor(pos)
            with count_syncs() as r:
                cos, sin = KV.rope_rows(rope, start + torch.arange(n))
                outs.append(layer(xs, cos, sin, kv_cache=cache, start_pos=start))
            assert r.syncing_ops == 0, str(r)
            pos += n
    check_close(f"{impl} decode vs prefill", torch.cat(outs, dim=1), full, 1e-5)


def test_cache_update_reset_and_bad_inputs_name_the_argument():
    cache = KV.StaticKVCache(1, 8, 2, 4)
    k = torch.randn(1, 2, 3, 4)
    ck, cv = cache.update(torch.tensor(2), k, 2 * k)
    assert torch.equal(ck[:, :, 2:5], k) and torch.equal(cv[:, :, 2:5], 2 * k)
    assert ck[:, :, :2].abs().sum() == 0 and ck[:, :, 5:].abs().sum() == 0
    cache.reset()
    assert cache.k.abs().sum() == 0 and cache.v.abs().sum() == 0
    with pytest.raises(IndexError):  # position overflow is not checked on the host; on a CPU it raises
        cache.update(torch.tensor(6), k, k)
    q, k, v = qkv(1, 6, 2, 5, 5, 16)
    for fn in (A.manual_attention, A.sdpa_attention, A.chunked_attention):
        for args, kw, err, match in [
            ((q, k[..., :8], v), {}, ValueError, "head dim"),
            ((q, torch.randn(1, 4, 5, 16), torch.randn(1, 4, 5, 16)), {}, ValueError, "multiple of the number"),
            ((q, k.double(), v), {}, TypeError, "dtype"),
            ((q, k[:, :, :3], v[:, :, :3]), {}, ValueError, "S >= T"),
            ((q, k, v), {"attn_mask": torch.ones(3, 3, dtype=torch.bool)}, ValueError, "attn_mask"),
        ]:
            with pytest.raises(err, match=f"{fn.__name__}: .*{match}"):
                fn(*args, **kw)
    for kw in ({"impl": "flash"}, {"impl": "manual", "backend": "math"}, {"impl": "sdpa", "chunk_size": 8}):
        with pytest.raises(ValueError, match="attention: (impl|backend|chunk_size)"):
            A.attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="chunk_size"):
        A.chunked_attention(q, k, v, chunk_size=0)
    for args, kw in (((96, 6, 4), {}), ((100, 6), {}), ((96, 6), {"impl": "fast"}), ((96, 6), {"rope_impl": "x"})):
        with pytest.raises(ValueError, match="Attention: "):
            A.Attention(*args, **kw)
    layer, (x, rope) = make_layer(), layer_inputs()
    cache, bf16_cache = KV.StaticKVCache(B, 20, HKV, HD), KV.StaticKVCache(B, 20, HKV, HD, dtype=torch.bfloat16)
    cos, sin = rope.get(1)
    for kw, err, match in [
        ({"kv_cache": cache, "start_pos": 3}, TypeError, "start_pos must be a 0-dim int64"),
        ({"kv_cache": cache, "start_pos": torch.tensor(3, dtype=torch.int32)}, TypeError, "start_pos must"),
        ({"kv_cache": cache}, ValueError, "kv_cache needs start_pos"),
        ({"kv_cache": bf16_cache, "start_pos": torch.tensor(0)}, TypeError, "in torch.bfloat16"),
    ]:
        with pytest.raises(err, match=match):
            layer(x[:, :1], cos, sin, **kw)
    with pytest.raises(ValueError, match="k_new and v_new must be"):
        layer(x[:1, :1], cos, sin, kv_cache=cache, start_pos=torch.tensor(0))
    with pytest.raises(ValueError, match="StaticKVCache: batch"):
        KV.StaticKVCache(0, 20, HKV, HD)
    with pytest.raises(TypeError, match="StaticKVCache: dtype must be a floating"):
        KV.StaticKVCache(1, 20, HKV, HD, dtype=torch.int64)


@pytest.mark.gpu  # skipped without CUDA (conftest)
@pytest.mark.parametrize("T,S", [(256, 256), (40, 256)], ids=["square", "queries-at-end"])
def test_cuda_backends_match_reference(T, S):
    q, k, v = (t.cuda() for t in qkv(2, 8, 2, T, S, 64, dtype=torch.bfloat16))
    names = A.available_backends(q, k, v)
    assert "math" in names and "efficient" in names
    if torch.cuda.get_device_capability() >= (8, 0) and S == T:
        assert "flash" in names  # with S != T the causal mask is explicit, which flash cannot take
    ref = lambda q, k, v: reference(q, k, v)  # noqa: E731
    for name, fn in paths(q, k, v, True).items():
        compare_fn(fn, ref, [q, k, v], name=f"cuda {name}", tol=tolerance(torch.bfloat16))


@pytest.mark.gpu  # skipped without CUDA (conftest)
def test_cuda_graph_decode_step_matches_prefill_without_syncs():
    dev = torch.device("cuda")
    layer, (x, rope) = make_layer().to(dev), layer_inputs()
    x, rope = x.to(dev), rope.to(dev)
    with torch.no_grad():
        full = layer(x, *rope.get(T))
        cache = KV.StaticKVCache(B, 20, HKV, HD, device=dev, dtype=torch.float32)
        start = torch.zeros((), dtype=torch.int64, device=dev)
        x_step = torch.zeros(B, 1, DIM, device=dev)

        def step():
            cos, sin = KV.rope_rows(rope, start + torch.arange(1, device=dev))
            return layer(x_step, cos, sin, kv_cache=cache, start_pos=start)

        graph, out = capture_graph(step, warmup=2)  # warm-up on a side stream, then the capture
        with count_syncs() as r:
            step()
        assert r.count == 0, str(r)
        cache.reset()
        outs = []
        for t in range(T):
            x_step.copy_(x[:, t : t + 1])
            start.fill_(t)
            graph.replay()
            outs.append(out.clone())
    check_close("CUDA-graph decode vs prefill", torch.cat(outs, dim=1), full, tolerance(torch.float32, tf32=True))


@pytest.mark.parametrize("kind", ["bool", "float", "bool+causal"])
def test_fully_masked_rows_give_zero_on_every_path(kind):
    """Regression: a query row whose mask was all False gave NaN on some paths, 0 on others; now 0 on
    every path, with zero (finite) gradients, and the reference elsewhere."""
    T, S = 6, 9
    causal = kind == "bool+causal"
    mask = torch.rand(T, S, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[:, -1] = True  # every other row sees at least its last key
    mask[2], mask[0] = False, False
    mask[0, -1] = True  # row 0 sees only the last key, which the causal triangle hides from it (S > T)
    if kind == "float":
        mask = torch.zeros(T, S).masked_fill(~mask, float("-inf"))
    q, k, v = qkv(2, 4, 2, T, S, 8)
    i = torch.arange(T)[:, None]
    visible = mask if mask.dtype == torch.bool else mask > float("-inf")
    if causal:
        visible = visible & (torch.arange(S)[None, :] <= i + S - T)
    dead = ~visible.any(-1)
    assert dead[2] and (dead[0] or not causal)
    for name, fn in paths(q, k, v, causal, attn_mask=mask).items():
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        out = fn(qs, ks, vs)
        assert torch.equal(out[:, :, dead], torch.zeros_like(out[:, :, dead])), name
        live = reference(q.double(), k.double(), v.double(), causal, mask)[:, :, ~dead]
        check_close(f"{name} live rows", out[:, :, ~dead], live, 1e-5)
        out.backward(torch.randn_like(out))
        for t in (qs, ks, vs):
            assert torch.isfinite(t.grad).all(), name
        assert not qs.grad[:, :, dead].any(), name


def test_empty_query_block_on_every_path():
    """Regression: chunked_attention with q[:, :, :0] raised "torch.cat(): expected a non-empty list";
    so did Attention(impl="chunked") on a (2, 0, dim) input. Every path now returns (B, Hq, 0, Dv)."""
    q, k, v = qkv(2, 4, 2, 0, 9, 8)
    for causal in (True, False):
        for name, fn in paths(q, k, v, causal).items():
            assert fn(q, k, v).shape == (2, 4, 0, 8), name
    assert A.chunked_attention(*qkv(1, 2, 2, 0, 0, 8), causal=False).shape == (1, 2, 0, 8)
    for impl in A.IMPLS:
        layer = A.Attention(640, 10, impl=impl)
        x = torch.randn(2, 0, 640, requires_grad=True)
        cos, sin = RotaryCache(64, 8).get(0)
        y = layer(x, cos, sin)
        assert y.shape == (2, 0, 640), impl
        y.sum().backward()
        assert x.grad.shape == x.shape
