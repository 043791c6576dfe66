"""Test set-up: with no CUDA device, Triton kernels run under the interpreter (slow but exact)."""

import os

import pytest

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _cuda = False

if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _cuda:
            item.add_marker(skip_gpu)
