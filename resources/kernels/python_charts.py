"""sandkasten Python kernel, part 1 of 2 (python_kernel.py follows it in the same program): structured data of the
matplotlib figures a cell shows, in the shape the `e2b-code-interpreter` SDK reads as `result.chart` (its
`charts.py`): a line, scatter, bar, pie or box-and-whisker chart per axes, a "superchart" of them for a figure with
several. Read from the figure's artists after it was drawn; box plots from the numbers `Axes.boxplot` computed
(recorded by a wrapper installed when matplotlib's axes module is imported). Anything else has no chart.
"""

import sys as _charts_sys


def _chart_labels(ticks, labels):
    return [float(t) for t in ticks], [label.get_text() for label in labels]


def _chart_scale(axis):
    converter = getattr(axis, "converter", None) if not hasattr(axis, "get_converter") else axis.get_converter()
    name = type(converter).__name__ if converter is not None else ""
    if "Date" in name:
        return "datetime"
    if "StrCategory" in name:
        return "categorical"
    return axis.get_scale()


def _chart_value(axis, value):
    """A coordinate as E2B gives it: a date as ISO text, a category's name, else a number."""
    scale = _chart_scale(axis)
    if scale == "datetime":
        import matplotlib.dates as dates

        return dates.num2date(float(value)).isoformat()
    if scale == "categorical":
        mapping = getattr(axis.units, "_mapping", None) or {}
        for name, index in mapping.items():
            if index == value:
                return str(name)
    return float(value)


def _chart_2d(ax, kind, elements):
    return {"type": kind, "title": ax.get_title() or None, "x_label": ax.get_xlabel() or None,
            "y_label": ax.get_ylabel() or None, "x_unit": None, "y_unit": None, "elements": elements}


def _chart_points(ax, kind, series):
    chart = _chart_2d(ax, kind, [
        {"label": label, "points": [[_chart_value(ax.xaxis, x), _chart_value(ax.yaxis, y)] for x, y in points]}
        for label, points in series
    ])
    chart["x_ticks"], chart["x_tick_labels"] = _chart_labels(ax.get_xticks(), ax.get_xticklabels())
    chart["y_ticks"], chart["y_tick_labels"] = _chart_labels(ax.get_yticks(), ax.get_yticklabels())
    chart["x_scale"], chart["y_scale"] = _chart_scale(ax.xaxis), _chart_scale(ax.yaxis)
    return chart


def _chart_tick_label(ax, axis, position):
    ticks = list(axis.get_majorticklocs())
    texts = [label.get_text() for label in (ax.get_xticklabels() if axis is ax.xaxis else ax.get_yticklabels())]
    for tick, text in zip(ticks, texts):
        if abs(float(tick) - position) < 1e-9 and text:
            return text
    return str(_chart_value(axis, position))


def _chart_of_axes(ax):
    """The chart one axes shows, or None."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    boxes = getattr(ax, "_sandkasten_boxplots", None)
    if boxes:
        elements = []
        for stats in boxes:
            for box in stats:
                elements.append({"label": str(box.get("label", "")), "min": float(box["whislo"]),
                                 "first_quartile": float(box["q1"]), "median": float(box["med"]),
                                 "third_quartile": float(box["q3"]), "max": float(box["whishi"]),
                                 "outliers": [float(v) for v in box["fliers"]]})
        return _chart_2d(ax, "box_and_whisker", elements)
    wedges = [patch for patch in ax.patches if isinstance(patch, Wedge)]
    if wedges and len(wedges) == len(ax.patches):
        return {"type": "pie", "title": ax.get_title() or None, "elements": [
            {"label": wedge.get_label(), "angle": abs(float(wedge.theta2 - wedge.theta1)), "radius": float(wedge.r)}
            for wedge in wedges
        ]}
    bars = [container for container in ax.containers if isinstance(container, BarContainer)]
    if bars:
        elements = []
        for container in bars:
            vertical = getattr(container, "orientation", "vertical") != "horizontal"
            for rect in container.patches:
                if vertical:
                    where, value, axis = rect.get_x() + rect.get_width() / 2, rect.get_height(), ax.xaxis
                else:
                    where, value, axis = rect.get_y() + rect.get_height() / 2, rect.get_width(), ax.yaxis
                elements.append({"label": _chart_tick_label(ax, axis, where), "group": container.get_label(),
                                 "value": float(value)})
        return _chart_2d(ax, "bar", elements)
    scatters = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    if scatters:
        return _chart_points(ax, "scatter", [(c.get_label(), c.get_offsets().tolist()) for c in scatters])
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 1]
    if lines:
        return _chart_points(ax, "line", [
            (line.get_label(), list(zip(line.get_xdata(orig=False), line.get_ydata(orig=False)))) for line in lines
        ])
    return None


def _figure_chart(figure):
    """The e2b chart of a figure (drawn already), or None when it shows nothing the SDK has a type for."""
    try:
        charts = [chart for chart in (_chart_of_axes(ax) for ax in figure.get_axes()) if chart is not None]
    except Exception:  # a figure this reader does not understand has no chart, never an error of the cell
        return None
    if len(charts) == 1:
        return charts[0]
    if charts:
        title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) is not None else None
        return {"type": "superchart", "title": title, "elements": charts}
    return None


def _record_boxplots(axes_module):
    """Wraps `Axes.boxplot` so that each axes remembers the statistics of its boxes (what the chart reports)."""
    original = axes_module.Axes.boxplot
    if getattr(original, "_sandkasten", False):
        return

    def boxplot(self, x, *args, **kwargs):
        drawn = original(self, x, *args, **kwargs)
        try:
            import matplotlib.cbook as cbook

            labels = kwargs.get("labels") or kwargs.get("tick_labels")
            whis = kwargs.get("whis", 1.5)
            stats = cbook.boxplot_stats(x, whis=whis, labels=list(labels) if labels is not None else None)
            for index, box in enumerate(stats):
                box.setdefault("label", str(index + 1))
            self.__dict__.setdefault("_sandkasten_boxplots", []).append(stats)
        except Exception:
            pass
        return drawn

    boxplot._sandkasten = True
    axes_module.Axes.boxplot = boxplot


class _BoxplotRecorder:
    """A meta-path finder that installs `_record_boxplots` when `matplotlib.axes._axes` is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.axes._axes":
            return None
        import importlib.util

        _charts_sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            _charts_sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_record(module):
            exec_module(module)
            _record_boxplots(module)

        loader.exec_module = exec_and_record
        return spec


_charts_sys.meta_path.insert(0, _BoxplotRecorder())
