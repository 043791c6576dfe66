"""Diagrams drawn from what a notebook measures (00's ceilings, 03's traced ops, 07's shares): each ``draw(...)``
returns a Figure. The diagrams with nothing measured in them are images in their notebook's markdown."""
