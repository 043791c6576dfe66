"""mahia.lessons.notebook: setup's CPU set-up (cpu_threads, cpu_note), listings as written, explorers' settings line."""

import html
import re

import IPython.display
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
    notebook.setup("nb", **kw)  # defaults: threads left alone, nothing said
    assert torch.get_num_threads() == before and "CPU run:" not in capsys.readouterr().out
    notebook.setup("nb", **kw, cpu_note="eager paths")
    assert "CPU run: eager paths" in capsys.readouterr().out
    ctx = notebook.setup("nb", **kw, cpu_threads=1, cpu_note="liger skipped")
    assert torch.get_num_threads() == 1 and seen == [before] * 3  # ceilings measured as in any run
    out = capsys.readouterr().out
    assert "CPU run: torch.set_num_threads(1) for this notebook" in out and out.rstrip().endswith("; liger skipped")
    assert not ctx.is_cuda


# -- listings: readable whatever the page's stylesheet says -------------------------------------------------
def _styles(markup: str, tag: str) -> list[dict[str, str]]:
    """The inline style of every ``tag`` in ``markup``, as {property: value}."""
    found = re.findall(rf"<{tag}\b[^>]*\bstyle='([^']*)'", markup)
    return [dict(tuple(p.strip() for p in d.split(":", 1)) for d in s.split(";") if d.strip()) for s in found]


LEFT_UNWRAPPED = {"text-align": "left", "white-space": "pre", "word-break": "normal", "overflow-x": "auto"}


def test_listings_keep_their_indentation_against_lab_css(monkeypatch):
    markup = notebook.side_by_side(
        "def f(x):\n    if x:\n        return [x, x]\n", "def after(x):\n    return [x] * 2\n"
    )
    pres, cells = _styles(markup, "pre"), _styles(markup, "td")
    assert len(pres) == 2 and len(cells) == 2
    for style in pres:  # JupyterLab's CSS: td/pre right-aligned, pre-wrap, break-all; inline styles win
        assert LEFT_UNWRAPPED.items() <= style.items(), style
    for style in cells:
        assert style["text-align"] == "left" and style["vertical-align"] == "top"
    assert _styles(markup, "table")[0]["table-layout"] == "fixed"  # a long line scrolls in its half, not widens it
    assert "\n        return [x, x]" in markup and "\n    return [x] * 2" in markup  # indentation kept as written
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj.data))
    notebook.show_source("if a < b:\n    pass\n")
    assert LEFT_UNWRAPPED.items() <= _styles(shown[0], "pre")[0].items() and "if a &lt; b:\n    pass" in shown[0]


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
    _update(part, index=1)  # a dropdown: the front end sends the index, the line shows the label
    assert seen[-1] == "running: log2 size=8, component=graph memory ..."
    assert line().startswith("log2 size=8, component=graph memory (")
    before = status.value
    _update(size, description="log2 size")  # an update that sets nothing: nothing runs, the line stays
    assert status.value == before and len(seen) == 2
    size.value = 3  # a change made from code: no running line, the output is headed after
    assert line() == "log2 size=3, component=graph memory" and len(seen) == 3


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


def test_explorer_shows_the_watched_widget_only_when_interactive(monkeypatch, capsys):
    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    monkeypatch.delenv("MAHIA_HEADLESS", raising=False)
    build = lambda: w.VBox([w.IntSlider(description="k"), w.Output()])  # noqa: E731
    notebook.explorer(False, build)
    assert "explorer skipped" in capsys.readouterr().out and not shown
    monkeypatch.setenv("MAHIA_HEADLESS", "1")
    notebook.explorer(True, build)
    assert "explorer skipped" in capsys.readouterr().out and not shown
    monkeypatch.delenv("MAHIA_HEADLESS")
    notebook.explorer(True, build)
    (box,) = shown
    assert any(isinstance(x, w.HTML) and _plain(x.value) == "k=0" for x in notebook._walk(box))
    notebook.explorer(True, lambda: "not a widget")  # shown as it is
    assert shown[-1] == "not a widget"
