"""The report's figures skip plotly's template copies (issue 35) and stay the same JSON.

`figure()` builds a figure without the default template and `fig_json` writes `plotly_white`
into its JSON; the page must hold exactly what `update_layout(template="plotly_white")` and
`to_json()` gave before, for plain figures, subplots, and figures built by `go.Figure()`.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fairbench.report.html import fig_html, fig_json, figure


def _draw(fig: go.Figure) -> go.Figure:
    """Traces, a shape, an annotation and layout fields set in the order the report sets them."""
    fig.add_trace(go.Scatter(x=[0.5, 1.0, 2.0], y=[0, 0.5, 1], name="tenant a", mode="lines"))
    fig.add_trace(go.Scattergl(x=np.arange(4.0), y=np.ones(4), mode="markers", name="lag"))
    fig.add_vrect(x0=0, x1=1, fillcolor="#888", opacity=0.12, line_width=0, layer="below")
    fig.add_annotation(x=0.5, y=1, yref="paper", text="warm-up", showarrow=False)
    fig.update_layout(title="t", xaxis_title="x (s)", xaxis_type="log")
    return fig


def _before(fig: go.Figure) -> str:
    """What fig_html wrote before: the template set on the figure, then plotly's to_json."""
    fig.update_layout(template="plotly_white")
    return fig.to_json()


def test_fig_json_is_the_json_of_the_figure_with_plotly_white() -> None:
    assert fig_json(_draw(figure())) == _before(_draw(go.Figure()))
    data = [go.Scatter(x=[1, 2], y=[3, 4], name="n")]
    assert fig_json(_draw(figure(data))) == _before(_draw(go.Figure(data)))
    # a figure built the old way (the default template in place) is written the same too
    assert fig_json(_draw(go.Figure())) == _before(_draw(go.Figure()))


def test_subplots_on_a_figure_without_the_template_give_the_same_json() -> None:
    def sub(fig: go.Figure | None) -> go.Figure:
        return make_subplots(
            rows=2, cols=1, shared_xaxes=True, figure=fig, subplot_titles=("a", "b")
        )

    new = sub(figure())
    new.add_trace(go.Scatter(x=[1, 2], y=[1, 2], name="q"), row=2, col=1)
    old = sub(None)
    old.add_trace(go.Scatter(x=[1, 2], y=[1, 2], name="q"), row=2, col=1)
    assert fig_json(new) == _before(old)


def test_figure_does_not_copy_the_default_template() -> None:
    """The point of `figure()`: its template is the stand-in, not plotly's few hundred
    properties (the copy that cost ~60 ms a figure)."""
    assert "layout" not in figure().to_dict()["layout"]["template"]
    assert "layout" not in figure(layout={"title": "t"}).to_dict()["layout"]["template"]
    assert len(go.Figure().to_dict()["layout"]["template"]["layout"]) > 10


def test_fig_html_embeds_the_json_with_the_page_template() -> None:
    fig = figure(go.Scatter(x=[1], y=[1], name="</script>"))
    out = fig_html(fig, "f")
    payload = out.split('id="f-data">', 1)[1].removesuffix("</script>")
    assert "</" not in payload
    assert payload.startswith('{"data":[') and '"layout":{"template":{"data"' in payload
    assert '"plot_bgcolor":"white"' in payload and '"height":380' in payload
