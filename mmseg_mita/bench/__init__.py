"""Measuring and modelling the MiTA kernels: ``python -m mmseg_mita.bench``."""
