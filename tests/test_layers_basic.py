"""The eager reference layers (RMSNorm, SwiGLU, RoPE) against independent formulas and properties."""

import math

import pytest
import torch

from mahia.layers.mlp import SwiGLU
from mahia.layers.norm import RMSNorm
from mahia.layers.rope import RotaryCache, apply_rope
from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager
from mahia.ops.rope import apply_rope_eager
from mahia.ops.swiglu import swiglu_eager

# ---------------------------------------------------------------- RMSNorm


def test_rms_norm_eager_formula():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 17, dtype=torch.float64)
    w = torch.randn(17, dtype=torch.float64)
    eps = 1e-5
    expected = torch.empty_like(x)
    for idx in torch.cartesian_prod(torch.arange(3), torch.arange(5)):  # row by row, spelled out
        row = x[idx[0], idx[1]]
        expected[idx[0], idx[1]] = row / math.sqrt(float((row**2).sum()) / 17 + eps) * w
    torch.testing.assert_close(rms_norm_eager(x, w, eps), expected)


def test_rms_norm_eager_computes_in_float32():
    x = torch.randn(4, 256, dtype=torch.bfloat16) * 300  # squares overflow nothing in fp32
    w = torch.ones(256, dtype=torch.bfloat16)
    y = rms_norm_eager(x, w)
    assert y.dtype == torch.bfloat16
    ref = rms_norm_eager(x.double(), w.double())
    assert (y.double() - ref).norm() / ref.norm() < 4e-3  # one bf16 rounding of the output


def test_add_rms_norm_eager_and_module():
    torch.manual_seed(1)
    x, r = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    norm = RMSNorm(8, eps=1e-6)
    y, h = norm(x, r)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(y, rms_norm_eager(x + r, norm.weight))
    y2, h2 = add_rms_norm_eager(x, r, norm.weight)
    torch.testing.assert_close(y, y2)
    assert norm(x).shape == x.shape
    assert "impl='eager'" in repr(norm)
    with pytest.raises(ValueError, match="dim must be a positive int"):
        RMSNorm(0)


def test_eager_references_reject_bad_inputs():
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm_eager(torch.randn(2, 8), torch.ones(4))
    with pytest.raises(TypeError, match="floating-point"):
        rms_norm_eager(torch.ones(2, 8, dtype=torch.long), torch.ones(8))
    with pytest.raises(ValueError, match="same shape"):
        swiglu_eager(torch.randn(2, 3), torch.randn(3, 2))


# ---------------------------------------------------------------- SwiGLU


def test_swiglu_eager_formula():
    a = torch.linspace(-8, 8, 101, dtype=torch.float64)
    b = torch.randn(101, dtype=torch.float64)
    torch.testing.assert_close(swiglu_eager(a, b), a / (1 + torch.exp(-a)) * b)


def test_swiglu_module_structure():
    torch.manual_seed(2)
    mlp = SwiGLU(16, 40, bias=True)
    assert mlp.w12.weight.shape == (80, 16) and mlp.w3.weight.shape == (16, 40)
    x = torch.randn(3, 16)
    u = mlp.w12(x)
    expected = mlp.w3(torch.nn.functional.silu(u[:, :40]) * u[:, 40:])  # first half is the gate
    torch.testing.assert_close(mlp(x), expected)
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        SwiGLU(16, -1)


# ---------------------------------------------------------------- RoPE


def test_rotary_cache_tables_and_slicing():
    cache = RotaryCache(8, 32, base=100.0)
    assert cache.cos.shape == (32, 4) and cache.cos.dtype == torch.float32
    assert "cos" not in cache.state_dict()  # non-persistent: rebuilt, never checkpointed
    theta = 100.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    torch.testing.assert_close(cache.cos[5].double(), torch.cos(5 * theta), rtol=0, atol=1e-7)
    cos, sin = cache.get(4, offset=10)
    assert cos.shape == (4, 4)
    torch.testing.assert_close(sin, cache.sin[10:14])
    with pytest.raises(ValueError, match="exceed max_seq_len = 32"):
        cache.get(8, offset=30)
    with pytest.raises(ValueError, match="head_dim must be a positive even int"):
        RotaryCache(7, 16)


def test_apply_rope_eager_is_complex_rotation():
    """Rotate-half RoPE is multiplication of (x1_i + i x2_i) by exp(i t theta_i)."""
    torch.manual_seed(3)
    B, T, Hq, Hkv, D = 2, 6, 4, 2, 16
    q = torch.randn(B, T, Hq, D, dtype=torch.float64)
    k = torch.randn(B, T, Hkv, D, dtype=torch.float64)
    cos, sin = RotaryCache(D, T).get(T)
    qr, kr = apply_rope_eager(q, k, cos, sin)
    angle = torch.atan2(sin.double(), cos.double())[:, None, :]  # (T, 1, D/2)
    for x, xr in ((q, qr), (k, kr)):
        z = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * torch.polar(torch.ones_like(angle), angle)
        torch.testing.assert_close(xr, torch.cat((z.real, z.imag), dim=-1))


def test_rope_scores_depend_only_on_relative_position():
    """<rope(q, t1), rope(k, t2)> is a function of t1 - t2: the point of RoPE."""
    torch.manual_seed(4)
    D = 32
    cache = RotaryCache(D, 64)
    q = torch.randn(1, 1, 1, D, dtype=torch.float64)
    k = torch.randn(1, 1, 1, D, dtype=torch.float64)

    def score(t1, t2):
        q1 = apply_rope_eager(q, q, *cache.get(1, t1))[0]
        k2 = apply_rope_eager(k, k, *cache.get(1, t2))[0]
        return float((q1 * k2).sum())

    assert score(10, 3) == pytest.approx(score(40, 33), rel=1e-6)
    assert score(10, 3) != pytest.approx(score(10, 4), rel=1e-3)


def test_apply_rope_dispatch_and_dtype():
    q = torch.randn(1, 3, 2, 8, dtype=torch.bfloat16)
    cos, sin = RotaryCache(8, 3).get(3)
    qr, kr = apply_rope(q, q, cos, sin)
    assert qr.dtype == torch.bfloat16 and kr.shape == q.shape
    with pytest.raises(ValueError, match="impl must be one of"):
        apply_rope(q, q, cos, sin, impl="nope")
