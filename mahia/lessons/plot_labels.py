"""Point labels that do not overlap (used by the rooflines of notebooks 00, 02 and 03, where points cluster).

    ax = plotting.roofline(points, ceilings, ...)
    spread_labels(ax)      # the labels plotting.roofline wrote, re-placed

Labels are placed in display space, measured with the figure's renderer: each label goes to the first free
spot near its point (right of it, then a line below or above, then left of it), where it overlaps no other
label, no marker, no legend and stays inside the axes; a label moved off its point's line is joined to it by
a thin line. :func:`overlapping_texts` is the check the tests use on every figure.
"""

from __future__ import annotations

from matplotlib.text import Text
from matplotlib.transforms import Bbox

__all__ = ["spread_labels", "drawn_texts", "overlapping_texts", "text_box"]


def _renderer(fig):
    canvas = fig.canvas
    if not hasattr(canvas, "get_renderer"):  # a canvas without its own renderer: draw on an Agg one
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = FigureCanvasAgg(fig)
    return canvas.get_renderer()


def text_box(t, renderer) -> Bbox:
    """The box of a text's own glyphs (an annotation's connector line left out)."""
    if hasattr(t, "update_positions"):  # an annotation places its text at draw time
        t.update_positions(renderer)
    return Text.get_window_extent(t, renderer)


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _relax(boxes: list[list[float]], anchors: list[float], fixed: list[Bbox], frame: Bbox, gap: float) -> float:
    """Move label boxes ``[x0, x1, yc, h]`` vertically until none overlaps another (those sharing x), a
    fixed box or the frame's edge: pairs push apart evenly, fixed boxes push a label to their nearer side.
    Returns the overlap left (0 when every label is free)."""
    for _ in range(400):
        moved = 0.0
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                if min(a[1], b[1]) - max(a[0], b[0]) <= 0:
                    continue
                need = (a[3] + b[3]) / 2 + gap - abs(a[2] - b[2])
                if need > 0:
                    up = a if (a[2], anchors[i]) > (b[2], anchors[j]) else b
                    down = b if up is a else a
                    up[2] += need / 2
                    down[2] -= need / 2
                    moved += need
        for box in boxes:
            for f in fixed:
                if min(box[1], f.x1) - max(box[0], f.x0) <= 0:
                    continue
                lo, hi = box[2] - box[3] / 2, box[2] + box[3] / 2
                if hi > f.y0 - gap and lo < f.y1 + gap:
                    shift = (f.y1 + gap - lo) if box[2] > (f.y0 + f.y1) / 2 else -(hi - f.y0 + gap)
                    box[2] += shift
                    moved += abs(shift)
            half = box[3] / 2
            box[2] = min(max(box[2], frame.y0 + half), frame.y1 - half)
        if moved < 1e-3:
            return 0.0
    return moved


def spread_labels(ax, *, fontsize: float = 8, offset_pt: float = 5, gap_pt: float = 1.5) -> list:
    """Re-place the text labels (``ax.texts``) of ``ax`` so that none overlaps another, a marker, the legend
    or the axes' edge. Settles the layout first (``tight_layout``, as :func:`mahia.measure.plotting.save`
    does) and keeps the labels out of it, so saving does not move the points under them.

    Each label starts right of its point (``offset_pt`` points away; left of it where the right side runs
    out of the axes), then labels that collide push each other up and down evenly, and markers and the
    legend push them aside, until every label is free (``gap_pt`` points apart). A label off its point's
    line is joined to it by a thin line. Returns the new annotations."""
    fig = ax.figure
    found = [a for a in ax.texts if hasattr(a, "xy")]
    labels = [(a.get_text().strip(), tuple(a.xy)) for a in found]
    for a in found:
        a.remove()
    if not labels:
        return []
    fig.tight_layout()
    renderer = _renderer(fig)
    to_px = fig.dpi / 72
    frame = ax.get_window_extent(renderer)
    points = [ax.transData.transform(xy) for _, xy in labels]
    r = 4.5 * to_px  # a marker of size 50 (points²) has a radius of about 4 points
    markers = [Bbox.from_extents(x - r, y - r, x + r, y + r) for x, y in points]
    legend = ax.get_legend()
    fixed_other = [legend.get_window_extent(renderer)] if legend is not None else []
    sizes = []
    for text, xy in labels:
        probe = ax.annotate(text, xy, fontsize=fontsize)
        box = text_box(probe, renderer)
        probe.remove()
        sizes.append((box.width, box.height))
    off = offset_pt * to_px
    fits = [(x + off + w <= frame.x1, x - off - w >= frame.x0) for (x, _), (w, _) in zip(points, sizes)]
    sides = [1 if right or not left else -1 for right, left in fits]
    boxes = [
        [x + off, x + off + w, y, h] if s > 0 else [x - off - w, x - off, y, h]
        for (x, y), (w, h), s in zip(points, sizes, sides)
    ]
    gap = gap_pt * to_px
    if _relax(boxes, [y for _, y in points], markers + fixed_other, frame, gap) > 0:
        _settle(boxes, points, sizes, sides, fits, off, markers, fixed_other, frame, gap)
    _uncross(boxes, points, sizes, sides, off, markers, fixed_other, frame, gap, 0.5 * to_px)
    out = []
    for (text, xy), (_x, y), s, b in zip(labels, points, sides, boxes):
        dy_pt = (b[2] - y) / to_px
        moved = abs(dy_pt) > 0.5
        ann = ax.annotate(
            text,
            xy,
            xytext=(s * offset_pt, dy_pt),
            textcoords="offset points",
            fontsize=fontsize,
            va="center",
            ha="left" if s > 0 else "right",
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5", "shrinkA": 0, "shrinkB": 3} if moved else None,
        )
        ann.set_in_layout(False)
        out.append(ann)
    return out


def _bbox(b: list[float], pad: float = 0.0) -> Bbox:
    return Bbox.from_extents(b[0] - pad, b[2] - b[3] / 2 - pad, b[1] + pad, b[2] + b[3] / 2 + pad)


def _settle(boxes, points, sizes, sides, fits, off, markers, fixed, frame, gap) -> None:
    """Where pushing apart left a label in conflict: move it, one at a time, to the free spot nearest its
    point (either side where it fits, up or down in half-line steps); one that fits nowhere stays."""

    def cost(i, b):
        box = _bbox(b, gap / 2)
        inside = frame.y0 <= box.y0 and box.y1 <= frame.y1 and frame.x0 <= box.x0 and box.x1 <= frame.x1
        others = [_bbox(o, gap / 2) for j, o in enumerate(boxes) if j != i]
        others += [m for j, m in enumerate(markers) if j != i] + list(fixed)  # its own marker may touch it
        return sum(_overlap(box, o) for o in others) + (0 if inside else 1e9)

    for i in range(len(boxes)):
        if cost(i, boxes[i]) == 0:
            continue
        (x, y), (w, h) = points[i], sizes[i]
        spots = []
        for side in (1, -1):
            if not fits[i][0 if side > 0 else 1] and any(fits[i]):
                continue
            for k in range(0, 60):
                for dy in {0.0} if k == 0 else {k * h / 2, -k * h / 2}:
                    b = [x + off, x + off + w, y + dy, h] if side > 0 else [x - off - w, x - off, y + dy, h]
                    spots.append((abs(dy) + (0.5 * h if side != sides[i] else 0), side, b))
        for _, side, b in sorted(spots, key=lambda t: t[0]):
            if cost(i, b) == 0:
                boxes[i], sides[i] = b, side
                break


def _segments_cross(p1, p2, q1, q2) -> bool:
    """Whether the segments p1-p2 and q1-q2 cross (touching ends do not count)."""

    def side(a, b, c) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    return side(q1, q2, p1) * side(q1, q2, p2) < 0 and side(p1, p2, q1) * side(p1, p2, q2) < 0


def _uncross(boxes, points, sizes, sides, off, markers, fixed, frame, gap, still_px) -> None:
    """Two labels whose leader lines cross (matplotlib draws each from the point towards its label's centre)
    are re-placed, the two of them only: either side of its point, the two heights kept or swapped, where
    both stay free and fewer lines cross (the H100's matmul 4096 and 8192, review 00-10)."""

    def leader(k, b):
        return points[k], ((b[0] + b[1]) / 2, b[2])

    def crossings(bs) -> int:  # pairs of leader lines that cross, among labels moved off their point's line
        moved = [k for k, b in bs.items() if abs(b[2] - points[k][1]) > still_px]
        return sum(
            _segments_cross(*leader(i, bs[i]), *leader(j, bs[j])) for n, i in enumerate(moved) for j in moved[n + 1 :]
        )

    def free(k, b, bs):
        box = _bbox(b, gap / 2)
        inside = frame.y0 <= box.y0 and box.y1 <= frame.y1 and frame.x0 <= box.x0 and box.x1 <= frame.x1
        rest = [_bbox(o, gap / 2) for j, o in bs.items() if j != k] + [m for j, m in enumerate(markers) if j != k]
        return inside and sum(_overlap(box, o) for o in rest + list(fixed)) == 0

    def placed(k, side, y):
        x, w = points[k][0], sizes[k][0]
        return [x + off, x + off + w, y, sizes[k][1]] if side > 0 else [x - off - w, x - off, y, sizes[k][1]]

    for _ in range(len(boxes)):  # each change removes at least one crossing, so this ends
        now = dict(enumerate(boxes))
        count, best = crossings(now), None
        pairs = [(i, j) for i in now for j in now if i < j and _segments_cross(*leader(i, now[i]), *leader(j, now[j]))]
        for i, j in pairs:
            for si in (sides[i], -sides[i]):
                for sj in (sides[j], -sides[j]):
                    for yi, yj in ((now[i][2], now[j][2]), (now[j][2], now[i][2])):
                        bi, bj = placed(i, si, yi), placed(j, sj, yj)
                        trial = {**now, i: bi, j: bj}
                        if free(i, bi, trial) and free(j, bj, trial) and (n := crossings(trial)) < count:
                            count, best = n, (i, j, si, sj, bi, bj)
        if best is None:
            return
        i, j, sides[i], sides[j], boxes[i], boxes[j] = best


def drawn_texts(fig) -> list:
    """The visible, non-empty texts of ``fig`` that a draw shows: titles, axis and tick labels (only of the
    ticks inside the view), annotations, legends and figure texts."""
    _renderer(fig)  # gives the figure an Agg canvas if it has none that renders
    fig.canvas.draw()
    tick_labels, shown, hidden = set(), set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels |= {id(tick.label1), id(tick.label2)}
            if not (ax.axison and axis.get_visible()):  # ax.axis("off"): no ticks, no axis label
                hidden |= {id(axis.label), id(axis.get_offset_text())}
                continue
            for tick in axis._update_ticks():  # the ticks a draw shows (inside the view interval)
                shown |= {id(t) for t in (tick.label1, tick.label2) if t.get_visible()}
    return [
        t
        for t in fig.findobj(Text)
        if t.get_visible()
        and t.get_text().strip()
        and id(t) not in hidden
        and (id(t) not in tick_labels or id(t) in shown)
    ]


def overlapping_texts(fig, *, tol_px: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of :func:`drawn_texts` of ``fig`` whose bounding boxes, as the figure's renderer draws them,
    overlap by more than ``tol_px`` in both directions."""
    renderer = _renderer(fig)
    boxes = [(t.get_text().strip(), text_box(t, renderer)) for t in drawn_texts(fig)]
    found = []
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1 :]:
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > tol_px and h > tol_px:
                found.append((a, b))
    return found
