"""Measuring helpers of the benchmark tools (``tools/benchmark_*.py``);
PyTorch only, like :mod:`mmseg_mita.ops`."""
from .cli import (DTYPES, add_deadline_option, add_measuring_options,
                  measuring_device, start_measuring)
from .measure import (load_average, machine_info, peak_memory, run_timed,
                      summarize, synchronize, time_interleaved)

__all__ = [
    'DTYPES', 'add_deadline_option', 'add_measuring_options',
    'load_average', 'machine_info', 'measuring_device', 'peak_memory',
    'run_timed', 'start_measuring', 'summarize', 'synchronize',
    'time_interleaved'
]
