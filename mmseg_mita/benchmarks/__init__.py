"""Measuring helpers of the benchmark tools (``tools/benchmark_*.py``);
PyTorch only, like :mod:`mmseg_mita.ops`."""
from .measure import (load_average, machine_info, peak_memory, run_timed,
                      summarize, synchronize, time_interleaved)

__all__ = [
    'load_average', 'machine_info', 'peak_memory', 'run_timed', 'summarize',
    'synchronize', 'time_interleaved'
]
