"""mahia.lessons.notebook: setup's CPU threads and the explorers' settings line (listings: tests/test_lab.py)."""

import html
import re

import ipywidgets as w
import torch

from mahia.lessons import notebook
from mahia.measure import hardware


def test_cpu_threads_set_after_the_ceilings_and_said(monkeypatch, request, tmp_path, capsys):
    before, seen = torch.get_num_threads(), []  # ceilings without measuring, noting torch's threads when asked
    request.addfinalizer(lambda: torch.set_num_threads(before))
    fake = hardware.Ceilings(hardware.device_slug("cpu"), 10.0, 1.0, 0.5, "2026-01-01T00:00:00")
    monkeypatch.setattr(hardware, "ceilings", lambda dev, **kw: seen.append(torch.get_num_threads()) or fake)
    kw = dict(device="cpu", results_dir=str(tmp_path), figures_dir=str(tmp_path))
    notebook.setup("nb", **kw)  # default: threads left alone
    assert torch.get_num_threads() == before
    assert not notebook.setup("nb", **kw, cpu_threads=1, cpu_note="liger skipped").is_cuda
    assert torch.get_num_threads() == 1 and seen == [before] * 2  # ceilings measured as in any run
    assert "liger skipped" in capsys.readouterr().out


# -- explorers: which settings made the output, and that it is running --------------------------------------
def _update(widget, **state):
    """What the front end sends when a reader moves a control (the kernel's comm handler calls this)."""
    widget._handle_msg({"content": {"data": {"method": "update", "state": state}}, "buffers": []})


def _plain(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def _watched(box):
    """``watch_settings(box)`` and a function reading its settings line as the reader sees it."""
    shown = notebook.watch_settings(box)
    status = next(x for x in notebook._walk(shown) if isinstance(x, w.HTML))
    return shown, status, lambda: _plain(status.value)


def test_an_explorer_says_running_then_heads_its_output_with_the_settings():
    size = w.IntSlider(value=6, min=2, max=9, description="log2 size")
    part = w.Dropdown(options=["GLA (T)", "graph memory"], description="component")
    out, seen, line = w.Output(), [], lambda: ""

    def rerun(_=None):  # as most notebooks build one: callbacks that print into an Output
        seen.append(line())  # what the reader sees meanwhile
        out.outputs = ({"output_type": "stream", "name": "stdout", "text": f"{part.value} at {2**size.value}\n"},)

    size.observe(rerun, "value")
    part.observe(rerun, "value")
    rerun()  # build() runs the explorer once, before it is watched
    shown, status, line = _watched(w.VBox([w.HBox([size, part]), out]))
    kids = list(shown.children)
    assert kids.index(status) == kids.index(out) - 1  # the line sits right above the output
    assert line() == "log2 size=6, component=GLA (T)"  # the first run's settings
    seen.clear()
    _update(size, value=8)  # a slider moved in the browser
    assert seen == ["running: log2 size=8, component=GLA (T) ..."]  # said before the explorer computed
    assert line().startswith("log2 size=8, component=GLA (T) (") and line().endswith(" s)")
    assert out.outputs[0]["text"] == "GLA (T) at 256\n"
    size.value = 3  # a change made from code: no running line, the output is headed after
    assert line() == "log2 size=3, component=GLA (T)" and len(seen) == 2


def test_an_explorer_run_by_a_button_says_what_the_output_is_for_and_a_failure_says_so():
    dim, go, seen = w.Dropdown(options=[64, 128], description="dim"), w.Button(description="time"), []
    go.on_click(lambda _b: seen.append(line()))
    _, _, line = _watched(w.VBox([w.HBox([dim, go]), w.Output()]))
    assert line() == "press 'time' to run: dim=64"  # nothing ran yet
    _update(dim, index=1)  # a setting alone runs nothing here
    assert line() == "set: dim=128 (press 'time' to run)" and seen == []
    go._handle_custom_msg({"event": "click"}, [])  # the button, clicked in the browser
    done = line()
    assert seen == ["running: dim=128 ..."] and done.startswith("dim=128 (") and done.endswith(" s)")
    _update(dim, index=0)
    assert line() == f"output: {done}; set: dim=64 (press 'time' to run)"
    size = w.IntSlider(value=1, description="n")
    size.observe(lambda change: (_ for _ in ()).throw(RuntimeError("out of memory")), "value")
    _, _, line = _watched(w.VBox([size, w.Output()]))
    _update(size, value=2)  # the comm handler logs the traceback; the reader sees the line
    assert line() == "n=2: failed, RuntimeError: out of memory"
