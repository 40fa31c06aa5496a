"""IPython start-up file for the docs build's notebook kernel (copied into its profile by aspan_docs.py).

plotly's default renderer in a kernel, `plotly_mimetype+notebook`, emits HTML that loads MathJax from a CDN; this one
emits the figure's `<div>` and its `Plotly.newPlot` call only, which the page runs with its own `plotly.min.js`."""


def _install_offline_renderer() -> None:
    import plotly.io as pio
    from plotly.io.base_renderers import MimetypeRenderer

    class OfflineHtml(MimetypeRenderer):
        """A figure as an HTML fragment that loads nothing: no plotly.js, no MathJax, no require.js."""

        def to_mimebundle(self, fig_dict):
            html = pio.to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                               default_width="100%", default_height=525, validate=False)
            return {"text/html": html}

    pio.renderers["offline_html"] = OfflineHtml()
    pio.renderers.default = "offline_html"


_install_offline_renderer()
del _install_offline_renderer
