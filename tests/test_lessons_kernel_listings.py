"""mahia.lessons.kernel_listings: every listed object resolves, and the configurations are the kernels' own."""

import inspect

import pytest
import torch

from mahia.lessons import kernel_listings as kl


@pytest.mark.parametrize("name", sorted(kl.LISTINGS))
def test_every_listing_resolves_to_code_with_a_source(name):
    obj = kl.listing(name)
    src = inspect.getsource(getattr(obj, "fn", obj))  # a @triton.jit kernel wraps the function it compiles
    assert src.lstrip().startswith(("def ", "@"))


def test_unknown_listing_names_the_listed_ones():
    with pytest.raises(KeyError, match="rms_norm_fwd_kernel"):
        kl.listing("no_such_kernel")


def test_production_kernels_are_the_listed_kernels():
    kernels = kl.production_kernels()
    assert list(kernels) == list(kl.KERNELS)
    assert set(kl.KERNELS) <= set(kl.LISTINGS)
    assert kernels["rms_norm_fwd_kernel"] is kl.listing("rms_norm_fwd_kernel")


def test_rms_norm_configs():
    bm, bn, nw = kl.rms_norm_fwd_config(1000)
    assert (bm, bn) == (4, 1024) and bm * bn // 512 == nw  # small rows: several per program
    assert kl.rms_norm_fwd_config(16384)[:2] == (1, 16384)
    assert kl.rms_norm_bwd_config(1000)[:3] == (bm, bn, nw)
    assert kl.rms_norm_bwd_config(1000)[3] == 2 and kl.rms_norm_bwd_config(16384)[3] == 1
    # by row count: few rows of a narrow hidden size take 4-row tiles, one program per SM
    assert kl.rms_norm_bwd_config(2048, 512) == (4, 2048, 8, 1)
    assert kl.rms_norm_bwd_config(2048, 8192) == kl.rms_norm_bwd_config(2048) == (2, 2048, 8, 2)
    assert kl.rms_norm_bwd_config(8192, 16384)[0] == 2 and kl.rms_norm_bwd_config(8192, 1024)[0] == 1
    assert kl.rms_norm_bwd_config(8192, 16384, torch.float32)[0] == 1  # fp32: one row (registers)
    assert kl.sm_count("cpu") == 4  # the interpreter's stand-in
