"""The one table writer and the one plot writer of the subcommands.

A table is a list of :class:`Column` over the rows of a document: plain
text (aligned, for the terminal) or markdown (for the docs and the model
card). A plot is a list of :class:`Panel` of curves, written as PNG with
matplotlib (``--plot`` says clearly when matplotlib is missing).
"""
from typing import Callable, List, NamedTuple, Optional, Sequence, Union

from mmseg_mita.utils import write_atomic

Value = Union[str, Callable[[dict], object]]


class Column(NamedTuple):
    """``header``; ``value``: a row key or a function of the row (None or a
    missing key: ``-``); ``fmt``: a format string (``'{:.2f}'``) or a
    function of the value; ``left``: aligned left (text) rather than right
    (numbers)."""
    header: str
    value: Value
    fmt: Union[str, Callable[[object], str]] = '{}'
    left: bool = False

    def cell(self, row: dict) -> str:
        value = (row.get(self.value) if isinstance(self.value, str) else
                 self.value(row))
        if value is None:
            return '-'
        return (self.fmt.format(value) if isinstance(self.fmt, str) else
                self.fmt(value))


def format_table(rows: Sequence[dict], columns: Sequence[Column],
                 markdown: bool = False,
                 notes: Sequence[str] = ()) -> str:
    """``rows`` under ``columns``, then the ``notes`` (one line each)."""
    cells = [[c.cell(r) for c in columns] for r in rows]
    if markdown:
        lines = ['| ' + ' | '.join(c.header for c in columns) + ' |',
                 '|' + '|'.join('---' if c.left else '---:'
                                for c in columns) + '|']
        lines += ['| ' + ' | '.join(row) + ' |' for row in cells]
        notes = [''] + list(notes) if notes else []
    else:
        widths = [max([len(c.header)] + [len(row[i]) for row in cells])
                  for i, c in enumerate(columns)]

        def line(texts):
            return ' | '.join(
                t.ljust(w) if c.left else t.rjust(w)
                for t, w, c in zip(texts, widths, columns)).rstrip()

        lines = [line([c.header for c in columns])]
        lines += [line(row) for row in cells]
    return '\n'.join(lines + list(notes))


class Table(NamedTuple):
    """A document's table: ``table(doc, markdown)`` formats its rows."""
    columns: Sequence[Column]
    notes: Sequence[str] = ()

    def __call__(self, doc: dict, markdown: bool) -> str:
        return format_table(doc['rows'], self.columns, markdown, self.notes)


def fixed(header: str, key: str, digits: int = 2) -> Column:
    """A number (a ratio, fps) with ``digits`` decimals."""
    return Column(header, key, f'{{:.{digits}f}}')


def significant(header: str, key: str, digits: int = 3) -> Column:
    """A rate with ``digits`` significant digits (``0.0153``, ``12.3``,
    ``1234``): on CPU a segmentor runs at hundredths of an image a second,
    where fixed decimals would keep one digit."""
    def text(v):
        if abs(float(f'{v:.{digits}g}')) >= 10**(digits - 1):
            return f'{v:.0f}'
        return f'{v:#.{digits}g}'
    return Column(header, key, text)


def milliseconds(header: str = 'ms', digits: int = 2) -> Column:
    """The best time of a row (``best_s``) in milliseconds."""
    return Column(header, 'best_s', lambda v: f'{v * 1e3:.{digits}f}')


# The error of a failed measurement (its other cells are ``-``).
ERROR = Column('error', lambda r: r.get('error', '')[:80], left=True)


def write_text(path: str, text: str) -> None:
    """``text`` to ``path``, atomically."""
    def write(tmp):
        with open(tmp, 'w') as f:
            f.write(text)

    write_atomic(path, write)


class Curve(NamedTuple):
    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = 'o-'


class Panel(NamedTuple):
    """One set of axes: its curves, labels, log scales."""
    title: str
    xlabel: str
    ylabel: str
    curves: List[Curve]
    log: bool = True


def plot_panels(path: str, panels: Sequence[Panel], columns: int,
                title: Optional[str] = None) -> None:
    """``panels`` in a grid of ``columns`` columns, as a PNG at ``path``."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit('--plot needs matplotlib: pip install matplotlib')
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, squeeze=False,
                             figsize=(4.6 * columns, 3.8 * rows))
    for ax, panel in zip(axes.flat, panels):
        for curve in panel.curves:
            ax.plot(curve.x, curve.y, curve.style, label=curve.label)
        if panel.log:
            ax.set_xscale('log')
            ax.set_yscale('log')
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, which='both', alpha=0.3)
        if panel.curves:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format='png', dpi=110))
    plt.close(fig)
