"""IPython start-up file for the docs build's notebook kernel (copied into its profile by quiet_build.py).

plotly's default renderer in a kernel, `plotly_mimetype+notebook`, emits HTML that loads MathJax from a CDN; this one
emits the figure's `<div>` and its `Plotly.newPlot` call only, which the page runs with its own `plotly.min.js` (loaded
at the end of the page by the theme, so the call waits for the page to be parsed)."""


def _install_offline_renderer() -> None:
    import re

    import plotly.io as pio
    from plotly.io.base_renderers import MimetypeRenderer

    class OfflineHtml(MimetypeRenderer):
        """A figure as an HTML fragment that loads nothing: no plotly.js, no MathJax, no require.js."""

        def to_mimebundle(self, fig_dict):
            html = pio.to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                               default_width="100%", default_height=525, validate=False)
            wait = 'window.addEventListener("DOMContentLoaded", function () {%s});'
            html = re.sub(r'(<script(?: type="text/javascript")?>)(.*?)(</script>)',
                          lambda m: m[1] + wait % m[2] + m[3], html, flags=re.S)
            return {"text/html": html}

    pio.renderers["offline_html"] = OfflineHtml()
    pio.renderers.default = "offline_html"


_install_offline_renderer()
del _install_offline_renderer
