"""The eager reference layers (RMSNorm, SwiGLU, RoPE) against independent formulas and properties."""

import pytest
import torch

from mahia.layers.mlp import SwiGLU
from mahia.layers.norm import RMSNorm
from mahia.layers.rope import RotaryCache, apply_rope
from mahia.ops.rmsnorm import rms_norm_eager
from mahia.ops.rope import apply_rope_eager
from mahia.ops.swiglu import swiglu_eager


def test_rms_norm_formula_float32_compute_and_fused_residual():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 17, dtype=torch.float64)
    w = torch.randn(17, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).sum(-1, keepdim=True) / 17 + 1e-5) * w  # sum of squares over the row
    torch.testing.assert_close(rms_norm_eager(x, w, 1e-5), expected)
    xb = torch.randn(4, 256, dtype=torch.bfloat16) * 300  # squares that fit float32, not bfloat16 sums
    y, ref = rms_norm_eager(xb, torch.ones(256, dtype=torch.bfloat16)), rms_norm_eager(xb.double(), torch.ones(256))
    assert y.dtype == torch.bfloat16 and (y.double() - ref).norm() / ref.norm() < 4e-3  # one bf16 rounding
    norm, r = RMSNorm(17, eps=1e-5).double(), torch.randn_like(x)
    y, h = norm(x, r)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(y, rms_norm_eager(x + r, norm.weight, 1e-5))
    with pytest.raises(ValueError, match="RMSNorm: dim must be a positive int"):
        RMSNorm(0)
    with pytest.raises(ValueError, match="RMSNorm: impl must be one of"):
        RMSNorm(8, impl="cuda")


def test_swiglu_formula_and_module_structure():
    a, b = torch.linspace(-8, 8, 101, dtype=torch.float64), torch.randn(101, dtype=torch.float64)
    torch.testing.assert_close(swiglu_eager(a, b), a / (1 + torch.exp(-a)) * b)
    mlp = SwiGLU(16, 40)
    assert mlp.w12.weight.shape == (80, 16) and mlp.w3.weight.shape == (16, 40)
    u = mlp.w12(x := torch.randn(3, 16))
    torch.testing.assert_close(mlp(x), mlp.w3(torch.nn.functional.silu(u[:, :40]) * u[:, 40:]))  # gate first
    with pytest.raises(ValueError, match="SwiGLU: hidden must be a positive int"):
        SwiGLU(16, -1)
    with pytest.raises(ValueError, match="SwiGLU: impl must be one of"):
        SwiGLU(16, 40, impl="cuda")


def test_rotary_cache_tables_and_slicing():
    cache = RotaryCache(8, 32, base=100.0)
    assert cache.cos.shape == (32, 4) and cache.cos.dtype == torch.float32
    assert "cos" not in cache.state_dict()  # non-persistent: rebuilt, never checkpointed
    theta = 100.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    torch.testing.assert_close(cache.cos[5].double(), torch.cos(5 * theta), rtol=0, atol=1e-7)
    cos, sin = cache.get(4, offset=10)
    torch.testing.assert_close(sin, cache.sin[10:14])
    with pytest.raises(ValueError, match="exceed max_seq_len = 32"):
        cache.get(8, offset=30)
    with pytest.raises(ValueError, match="head_dim must be a positive even int"):
        RotaryCache(7, 16)


def test_rope_is_a_complex_rotation():
    """Rotate-half RoPE multiplies (x1_i + i x2_i) by exp(i t theta_i), so <rope(q, t1), rope(k, t2)>
    depends on t1 - t2 only: the complex product of the two rotations is exp(i (t1 - t2) theta_i)."""
    torch.manual_seed(3)
    D, T = 16, 64
    q, k = torch.randn(2, T, 4, D, dtype=torch.float64), torch.randn(2, T, 2, D, dtype=torch.float64)
    cache = RotaryCache(D, T)
    qr, kr = apply_rope_eager(q, k, *cache.get(T))
    angle = torch.atan2(cache.sin.double(), cache.cos.double())[:, None, :]  # (T, 1, D/2)
    for x, xr in ((q, qr), (k, kr)):
        z = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * torch.polar(torch.ones_like(angle), angle)
        torch.testing.assert_close(xr, torch.cat((z.real, z.imag), dim=-1))
    qb = q.bfloat16()
    assert apply_rope(qb, qb, *cache.get(T))[0].dtype == torch.bfloat16
