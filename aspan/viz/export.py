"""Static images (PNG or SVG) of saved plotly figures, through plotly's own exporter (kaleido), which drives the
local Chromium: nothing is downloaded. For pages that cannot run JavaScript, such as a README on a code host.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import plotly.graph_objects as go
import plotly.io as pio

from ..errors import OPTIONAL_PACKAGES, MissingPackage
from ..io import atomic_dir

IMAGE_FORMATS = ("png", "svg")
WIDTH, HEIGHT = 900, 500  # pixels, for figures that do not set their own size


def export_images(figures: Mapping[str, go.Figure], out_dir: str | Path, fmt: str = "png") -> list[Path]:
    """Write each figure as `out_dir/NAME.fmt` ({NAME: figure}), all at once; returns the paths.

    Each image keeps the figure's own width and height (else 900 x 500). MissingPackage without kaleido;
    ValueError when no Chromium can be started. The images appear together or not at all.
    """
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format must be one of {', '.join(IMAGE_FORMATS)}, got {fmt!r}")
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise MissingPackage("kaleido", OPTIONAL_PACKAGES["kaleido"], "static images") from None
    figs, names = list(figures.values()), [f"{name}.{fmt}" for name in figures]
    with atomic_dir(out_dir) as tmp:
        try:
            pio.write_images(figs, [tmp / name for name in names], format=fmt,
                             width=[f.layout.width or WIDTH for f in figs],
                             height=[f.layout.height or HEIGHT for f in figs])
        except Exception as e:  # kaleido's errors for a missing or failing browser: one line, what to install
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"static images need a Chromium that kaleido can start (apt-get install chromium): "
                             f"{first[:200]}") from None
    return [Path(out_dir) / name for name in names]

