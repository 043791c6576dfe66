"""mahia.lessons.notebook.setup: the CPU set-up every notebook asks for in one call (cpu_threads, cpu_note)."""

import pytest
import torch

from mahia.lessons import notebook
from mahia.measure import hardware


@pytest.fixture
def fake_ceilings(monkeypatch):
    """Ceilings without measuring, noting how many threads torch had when they were asked for."""
    seen = []

    def ceilings(dev, **kw):
        seen.append(torch.get_num_threads())
        return hardware.Ceilings(hardware.device_slug(dev), 10.0, 1.0, 0.5, "2026-01-01T00:00:00")

    monkeypatch.setattr(hardware, "ceilings", ceilings)
    threads = torch.get_num_threads()
    yield seen
    torch.set_num_threads(threads)


def test_cpu_threads_set_after_the_ceilings_and_said(fake_ceilings, tmp_path, capsys):
    before = torch.get_num_threads()
    ctx = notebook.setup(
        "nb",
        device="cpu",
        results_dir=str(tmp_path),
        figures_dir=str(tmp_path),
        cpu_threads=1,
        cpu_note="liger skipped",
    )
    assert torch.get_num_threads() == 1 and fake_ceilings == [before]  # ceilings measured as in any run
    out = capsys.readouterr().out
    assert "CPU run: torch.set_num_threads(1) for this notebook" in out and out.rstrip().endswith("; liger skipped")
    assert not ctx.is_cuda


def test_defaults_leave_threads_alone_and_say_nothing(fake_ceilings, tmp_path, capsys):
    before = torch.get_num_threads()
    notebook.setup("nb", device="cpu", results_dir=str(tmp_path), figures_dir=str(tmp_path))
    assert torch.get_num_threads() == before
    assert "CPU run:" not in capsys.readouterr().out


def test_a_note_alone_is_printed(fake_ceilings, tmp_path, capsys):
    notebook.setup("nb", device="cpu", results_dir=str(tmp_path), figures_dir=str(tmp_path), cpu_note="eager paths")
    assert "CPU run: eager paths" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_cpu_threads_must_be_a_positive_int(bad, tmp_path):
    with pytest.raises(ValueError, match="cpu_threads"):
        notebook.setup("nb", device="cpu", results_dir=str(tmp_path), cpu_threads=bad)
