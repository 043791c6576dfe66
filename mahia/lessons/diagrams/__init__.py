"""Diagrams the notebooks draw with matplotlib, one module per idea (issue 15: diagrams drawn by code).

Each module has a ``draw(...) -> matplotlib.figure.Figure`` (or a few named ``draw_*``) that a notebook
calls and shows; nothing is measured here, so a diagram looks the same on every machine.
"""
