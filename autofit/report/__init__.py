"""`autofit report`: a finished study's answer, read from its results folder.

study.py reads summary.json and trials.csv; tables.py turns them into the report's tables (and a
comparison's); compare.py matches two studies configuration by configuration and finds the
regressions; charts.py holds what the two charts show, which plots.py draws as PNG (matplotlib) and
html.py as one self-contained page (plotly, inlined). The plotting libraries load only when drawn.
"""
