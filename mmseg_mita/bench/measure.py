"""Timing and peak-memory measurement shared by the subcommands of
``python -m mmseg_mita.bench``.

Peak memory on CPU: PyTorch keeps no allocator statistics for CPU tensors,
and ``tracemalloc``/RSS do not see them reliably (RSS also counts pages the
allocator keeps after a free). :func:`peak_memory` therefore runs the
function once under ``torch.profiler`` with ``profile_memory=True``, which
records every allocation and free made through PyTorch's CPU allocator (all
tensors, including the temporary buffers of ATen kernels), and returns the
highest running total of those events above the level at the start.
Memory that libraries allocate by themselves (MKL/oneDNN scratch) is not
counted. On CUDA it uses ``torch.cuda.max_memory_allocated``.
"""
import json
import os
import statistics
import tempfile
import time
from typing import Callable, Dict, Iterable, List, Optional

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _cpu_peak_bytes(fn: Callable[[], object]) -> int:
    with profile(activities=[ProfilerActivity.CPU],
                 profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix='.json')
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)['traceEvents']
    finally:
        os.remove(path)
    deltas = sorted((e['ts'], e['args']['Bytes']) for e in events
                    if e.get('name') == '[memory]'
                    and e['args'].get('Device Type', 0) == 0)
    peak = total = 0
    for _, nbytes in deltas:
        total += nbytes
        peak = max(peak, total)
    return peak


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes allocated by ``fn()`` at its peak, above what was allocated
    before the call (outputs and gradients it creates included)."""
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != 'cpu':
        raise ValueError(f'peak memory is measured on cpu or cuda, '
                         f'not {device.type!r}')
    return _cpu_peak_bytes(fn)


def run_timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes (device synchronised)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_interleaved(fns: Dict[str, Callable[[], object]],
                     device: torch.device,
                     repeats: int,
                     budget_s: float,
                     done: Optional[Dict[str, List[float]]] = None
                     ) -> Dict[str, List[float]]:
    """Time every function ``repeats`` times, round-robin, so that all of
    them see the same machine load. A function stops being repeated once
    its runs add up to ``budget_s`` seconds (it always runs once);
    ``done`` holds times already taken."""
    times = {name: list((done or {}).get(name, [])) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if times[name] and sum(times[name]) >= budget_s:
                continue
            times[name].append(run_timed(fn, device))
    return times


def summarize(times: List[float]) -> Dict[str, float]:
    return dict(best_s=min(times), median_s=statistics.median(times),
                runs=len(times))


def load_average() -> List[float]:
    """1, 5 and 15 minute load averages (other processes slow timings)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(
        os, 'getloadavg') else []


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage once (a
    model's parameters and buffers, an optimizer's state)."""
    seen = {}
    for t in tensors:
        if isinstance(t, Tensor) and t.device.type != 'meta':
            storage = t.untyped_storage()
            seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())
