"""Diagrams the notebooks draw with matplotlib, one module per idea: each ``draw(...)`` returns a Figure;
nothing is measured here, so a diagram looks the same on every machine."""
