"""The report as one self-contained HTML page: both charts, interactive (plotly, with plotly.js
inlined so the page works offline), and the report's tables."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from autofit.report import charts
from autofit.report.tables import Table, headline
from autofit.results import Study

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 1100px;
       color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }
th { background: #f4f4f4; } p.note { font-size: 0.9em; color: #444; }
td { white-space: nowrap; } td.words { white-space: normal; min-width: 24em; }
.chart { height: 520px; }
"""


def _pareto_figure(study: Study) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    points = charts.points(study)
    over = [p for p in points if not p.fits and not p.over_host]
    over_host = [p for p in points if p.over_host]
    fitting = [p for p in points if p.fits]
    for runs, symbol, (label, colour) in ((over, "x", charts.OVER_BUDGET),
                                          (over_host, "cross", charts.OVER_HOST)):  # fmt: skip
        if runs:
            fig.add_trace(go.Scatter(
                x=[p.megapixels for p in runs], y=[p.samples_per_s for p in runs],
                mode="markers", name=label,
                marker={"symbol": symbol, "color": colour, "size": 7},
                text=[f"{p.label}<br>{p.hover()}" for p in runs], hoverinfo="text",
            ))  # fmt: skip
    if fitting:
        fig.add_trace(go.Scatter(
            x=[p.megapixels for p in fitting], y=[p.samples_per_s for p in fitting],
            mode="markers", name="fits",
            marker={"color": [p.peak_gib for p in fitting], "colorscale": "Viridis", "size": 9,
                    "showscale": True, "colorbar": {"title": {"text": "peak (GiB)"}}},
            text=[f"{p.label}<br>{p.hover()}" for p in fitting], hoverinfo="text",
        ))  # fmt: skip
    for resolution, front in charts.fronts(study).items():
        fig.add_trace(go.Scatter(
            x=[p.megapixels for p in front], y=[p.samples_per_s for p in front],
            mode="lines+markers", name=f"Pareto front, {resolution} px",
            marker={"symbol": "circle-open", "size": 13}, text=[p.label for p in front],
            hoverinfo="text",
        ))  # fmt: skip
    best = charts.best_point(study)
    if best is not None:
        fig.add_trace(go.Scatter(
            x=[best.megapixels], y=[best.samples_per_s], mode="markers", name="best",
            marker={"symbol": "star", "size": 20, "color": "orange", "line": {"width": 1}},
            text=[f"best: {best.label}"], hoverinfo="text",
        ))  # fmt: skip
    wide = charts.log_x(points)
    fig.update_layout(
        title=charts.PARETO_TITLE,
        xaxis={"title": {"text": charts.RUN_SIZE_AXIS}, "type": "log" if wide else "linear"},
        yaxis={"title": {"text": charts.THROUGHPUT_AXIS}},
        legend={"orientation": "h", "y": -0.2},
    )
    if not fitting:
        fig.add_annotation(text=charts.NOTHING_FITS, showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
    return fig


def _memory_figure(study: Study) -> Any:
    import plotly.graph_objects as go

    unit, scale = charts.memory_unit(study.budget_bytes)
    bars = charts.bars(study)
    fig = go.Figure()
    labels = [("* " if b.best else "") + b.label.replace("\n", "<br>") for b in bars]
    for part in dict.fromkeys(p for b in bars for p in b.parts):
        fig.add_trace(go.Bar(
            y=labels, x=[b.parts.get(part, 0.0) for b in bars], name=part, orientation="h",
            hovertemplate=f"{part}: %{{x:.2f}} {unit}<extra></extra>",
        ))  # fmt: skip
    budget = study.budget_bytes / scale
    fig.add_vline(x=budget, line_dash="dash", annotation_text=f"budget {budget:.2f} {unit}")
    widest = max([budget, *(sum(b.parts.values()) for b in bars)])
    fig.update_layout(
        title=charts.MEMORY_TITLE,
        barmode="stack",
        xaxis={"title": {"text": f"memory ({unit})"}, "range": [0, widest * 1.08]},
    )
    if not bars:
        fig.add_annotation(text=charts.NOTHING_FITS, showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
    return fig


# A cell this long is words (why a run lost), which may wrap; shorter ones are figures ("1.20 GiB
# (50% pinned)", "batch_size=4") and stay on one line, so a number is never cut from its unit.
WORDS = 40


def _cell(text: str) -> str:
    kind = ' class="words"' if len(text) > WORDS else ""
    return f"<td{kind}>{html.escape(text)}</td>"


def _table(table: Table) -> str:
    parts = [f"<h2>{html.escape(table.title)}</h2>"]
    if table.rows:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
        body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in table.rows)
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    if table.note:
        parts.append(f'<p class="note">{html.escape(table.note)}</p>')
    return "\n".join(parts)


def write_page(study: Study, tables: list[Table], path: Path) -> Path:
    """report.html: headline, both charts, then the tables. Needs no network to render."""
    config = {"displaylogo": False, "responsive": True}
    pareto = _pareto_figure(study).to_html(
        full_html=False, include_plotlyjs=True, div_id="pareto", config=config
    )
    memory = _memory_figure(study).to_html(
        full_html=False, include_plotlyjs=False, div_id="memory", config=config
    )
    title = f"autofit report: {study.name}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(headline(study))}</p>
<div class="chart">{pareto}</div>
<div class="chart">{memory}</div>
{"".join(_table(t) for t in tables)}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path
