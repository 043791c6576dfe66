"""Test set-up: with no CUDA device, Triton kernels run under the interpreter (slow but exact)."""

import os
from pathlib import Path

import pytest

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _cuda = False

if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported


@pytest.fixture
def bare_notebook_dir(tmp_path, monkeypatch) -> Path:
    """The runner's notebook folder replaced by one notebook, ``01_bare``, without a parameters cell: the
    runner reports it at once (failed) and starts no kernel, so a test of the runner's own files is quick."""
    import nbformat

    from mahia import runner

    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, nbdir / "01_bare.ipynb")
    monkeypatch.setattr(runner, "NOTEBOOK_DIR", nbdir)
    return nbdir


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not _cuda:
            item.add_marker(skip_gpu)
