"""How every picture is drawn and written: a bare `Figure` on the Agg canvas, saved, cleared.

No pyplot: nothing touches global backend state or leaks open figures, so
plotting inside a long sweep or a worker process costs only the drawing.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def save_figure(fig: Figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    fig.clear()
    return path


def no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
