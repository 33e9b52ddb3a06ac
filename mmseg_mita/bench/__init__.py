"""Measuring MiTA: ``python -m mmseg_mita.bench SUBCOMMAND`` (see
:mod:`mmseg_mita.bench.cli` for the subcommands).

Importing the package loads nothing; the subcommands that measure the
operator need PyTorch alone (the GPU machine has no mmseg), those that
measure segmentors import mmseg when they run.
"""
