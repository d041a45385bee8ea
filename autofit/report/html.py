"""The report as one self-contained HTML page: the answer first, then both charts, interactive
(plotly, with plotly.js inlined so the page works offline), in the colours charts.py declares,
then the report's tables and every probe."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from autofit.report import charts
from autofit.report.answer import Answer, answer
from autofit.report.tables import Table, headline, probes_table
from autofit.results import Study

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 1100px;
       color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }
th { background: #f4f4f4; } p.note { font-size: 0.9em; color: #444; }
td { white-space: nowrap; } td.words { white-space: normal; min-width: 24em; }
.chart { height: 520px; } .chart.memory { height: 600px; }
.answer { border: 2px solid #444; border-radius: 6px; padding: 0.6em 1.2em; margin: 1em 0; }
.answer h2 { margin-top: 0.2em; } .answer table { font-size: 0.95em; }
.answer th { background: none; vertical-align: top; } .answer td { white-space: normal; }
.answer code { white-space: nowrap; }
"""


def _pareto_figure(study: Study) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    points = charts.points(study)
    over = [p for p in points if not p.fits and not p.over_host]
    over_host = [p for p in points if p.over_host]
    fitting = [p for p in points if p.fits]
    view = charts.pareto_view(points)
    for runs, symbol, (label, colour) in ((over, "x", charts.OVER_BUDGET),
                                          (over_host, "cross", charts.OVER_HOST)):  # fmt: skip
        if runs:
            shown = [view.shown(p) for p in runs]
            fig.add_trace(go.Scatter(
                x=[x for x, _ in shown], y=[y for _, y in shown],
                mode="markers", name=label,
                marker={"symbol": symbol, "color": colour, "size": 7},
                text=[f"{p.label}<br>{p.hover()}" for p in runs], hoverinfo="text",
            ))  # fmt: skip
    if fitting:
        fig.add_trace(go.Scatter(
            x=[p.megapixels for p in fitting], y=[p.samples_per_s for p in fitting],
            mode="markers", name="fits",
            marker={"color": [p.peak_gib for p in fitting], "colorscale": charts.PEAK_SCALE, "size": 9,
                    "showscale": True, "colorbar": {"title": {"text": "peak (GiB)"}}},
            text=[f"{p.label}<br>{p.hover()}" for p in fitting], hoverinfo="text",
        ))  # fmt: skip
    for resolution, front in charts.fronts(study).items():
        fig.add_trace(go.Scatter(
            x=[p.megapixels for p in front], y=[p.samples_per_s for p in front],
            mode="lines+markers", name=f"Pareto front, {resolution} px",
            line={"color": charts.COLOURS["front"]},
            marker={"symbol": "circle-open", "size": 13, "color": charts.COLOURS["front"]},
            text=[p.label for p in front],
            hoverinfo="text",
        ))  # fmt: skip
    best = charts.best_point(study)
    if best is not None:
        fig.add_trace(go.Scatter(
            x=[best.megapixels], y=[best.samples_per_s], mode="markers", name="best",
            marker={"symbol": "star", "size": 20, "color": charts.COLOURS["best"],
                    "line": {"width": 1, "color": "black"}},
            text=[f"best: {best.label}"], hoverinfo="text",
        ))  # fmt: skip
    xaxis: dict[str, Any] = {
        "title": {"text": charts.RUN_SIZE_AXIS},
        "type": "log" if view.log else "linear",
    }
    yaxis: dict[str, Any] = {"title": {"text": charts.THROUGHPUT_AXIS}}
    if view.x is not None and view.y is not None:  # plotly takes a log range as powers of ten
        xaxis["range"] = [math.log10(v) for v in view.x] if view.log else list(view.x)
        yaxis["range"] = list(view.y)
    fig.update_layout(
        title=charts.PARETO_TITLE,
        xaxis=xaxis,
        yaxis=yaxis,
        legend={"orientation": "h", "y": -0.2},
    )
    if not fitting:
        fig.add_annotation(text=charts.NOTHING_FITS, showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
    return fig


# Each kind of probe on the memory panel: (symbol, colour or None for its series' colour).
PEAK_MARKS = {"fits": ("circle", None), "over": ("x", charts.COLOURS["over"]),
              "over_host": ("cross", charts.COLOURS["over_host"])}  # fmt: skip


def _memory_figure(study: Study) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    axis = charts.memory_axis(study)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.6, 0.4],
                        horizontal_spacing=0.03,
                        subplot_titles=[charts.PEAKS_TITLE, charts.BARS_TITLE])  # fmt: skip
    for i, series in enumerate(charts.peak_series(study, axis)):
        colour = charts.SERIES[i % len(charts.SERIES)]
        marks = [("triangle-up", charts.COLOURS["over"]) if p.off_axis else PEAK_MARKS[p.kind]
                 for p in series.peaks]  # fmt: skip
        fig.add_trace(go.Scatter(
            x=[p.batch_size for p in series.peaks], y=[p.shown for p in series.peaks],
            mode="lines+markers", name=series.label, line={"color": colour, "width": 1},
            marker={"symbol": [s for s, _ in marks], "color": [c or colour for _, c in marks],
                    "size": 9},
            text=[p.label for p in series.peaks], hoverinfo="text",
        ), row=1, col=1)  # fmt: skip
    bars = charts.bars(study)
    # The axis names each bar by its resolution and batch; its knobs are in the hover.
    labels = [("* " if b.best else "") + b.label.split("\n")[0] for b in bars]
    for part in dict.fromkeys(p for b in bars for p in b.parts):
        fig.add_trace(go.Bar(
            x=labels, y=[b.parts.get(part, 0.0) for b in bars], name=part,
            marker={"color": charts.PART_COLOURS[part]},
            customdata=[b.label.replace("\n", " ") for b in bars],
            hovertemplate=f"%{{customdata}}<br>{part}: %{{y:.2f}} {axis.unit}<extra></extra>",
        ), row=1, col=2)  # fmt: skip
    # The total's label above its line, the budget's (always lower) below its own: a margin of
    # a few percent puts the two lines closer than a label is tall.
    for value, colour, dash, label, where in (
        (axis.total, charts.COLOURS["total"], "solid", axis.total_label(), "top left"),
        (axis.budget, charts.COLOURS["budget"], "dash", axis.budget_label(), "bottom left"),
    ):
        line = {"color": colour, "dash": dash, "width": 1.2}
        fig.add_hline(y=value, line=line, row=1, col=1, annotation_text=label,
                      annotation_position=where)  # fmt: skip
        fig.add_hline(y=value, line=line, row=1, col=2)
    fig.update_layout(
        title=charts.MEMORY_TITLE,
        barmode="stack",
        legend={"orientation": "h", "y": -0.2},
        yaxis={"title": {"text": f"memory ({axis.unit})"}, "range": [0, axis.top]},
        xaxis={"title": {"text": charts.BATCH_AXIS}},
    )
    if not bars:
        fig.add_annotation(text=charts.NOTHING_FITS, showarrow=False, x=0.8, y=0.5,
                           xref="paper", yref="paper")  # fmt: skip
    return fig


def _answer(box: Answer) -> str:
    """The answer as a box of labelled lines; a command in code, to copy."""
    rows = "".join(
        f"<tr><th>{html.escape(line.label)}</th><td>"
        + (f"<code>{html.escape(line.words)}</code>" if line.command else html.escape(line.words))
        + "</td></tr>"
        for line in box.lines
    )
    return f'<div class="answer" id="answer"><h2>{html.escape(box.title)}</h2><table>{rows}</table></div>'


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
    """report.html: the answer, the study's line, both charts, the tables, then every probe.
    Needs no network to render."""
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
{_answer(answer(study))}
<p>{html.escape(headline(study))}</p>
<div class="chart">{pareto}</div>
<div class="chart memory">{memory}</div>
{"".join(_table(t) for t in [*tables, probes_table(study)])}
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path
