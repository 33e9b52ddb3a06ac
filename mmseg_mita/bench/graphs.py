"""Graph-captured calls for the subcommands and their tests:
``torch.compile`` (``mode='reduce-overhead'`` records CUDA graphs of the
compiled parts) and whole-call CUDA graphs (``torch.cuda.CUDAGraph``).

A CUDA graph replays the kernels recorded once, with the same memory: the
inputs must be static tensors whose values are replaced in place
(``copy_``), and nothing in the recorded call may read a device value on
the host (the torch backend of MiTA does: its block layout has
data-dependent sizes, so only the Triton backend can be recorded whole).
"""
import argparse
from typing import Callable, List, Sequence, Tuple

import torch
from torch import Tensor


def reset_compiler() -> None:
    """Forget every compiled function (a fresh cache for the next shape:
    dynamo's cache of a function holds a few graphs only, 8 by default, and
    runs it eagerly beyond: the limit is raised to 64 here) and the
    graph-break counts."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    config = torch._dynamo.config
    name = ('recompile_limit' if hasattr(config, 'recompile_limit') else
            'cache_size_limit')
    setattr(config, name, max(getattr(config, name), 64))


def graph_breaks() -> int:
    """Graph breaks counted by dynamo since :func:`reset_compiler`."""
    return sum(torch._dynamo.utils.counters['graph_break'].values())


def add_compile_options(parser: argparse.ArgumentParser,
                        mode: str = 'reduce-overhead') -> None:
    """``--compile-mode`` (default ``mode``) and ``--compile-backend``
    (of :func:`compile_options`)."""
    parser.add_argument('--compile-mode', default=mode,
                        help="torch.compile mode (inductor's; default: "
                        '%(default)s)')
    parser.add_argument('--compile-backend', default='inductor',
                        help="torch.compile backend ('eager': dynamo only, "
                        "'aot_eager': and AOTAutograd; quick checks on CPU)")


def compile_options(mode: str = 'reduce-overhead',
                    backend: str = 'inductor') -> dict:
    """``torch.compile`` keywords: ``mode`` applies to inductor only
    (other backends, e.g. ``'eager'`` for a quick trace on CPU, take
    none)."""
    return dict(mode=mode) if backend == 'inductor' else dict(
        backend=backend)


def compiled(fn: Callable, mode: str = 'reduce-overhead',
             backend: str = 'inductor') -> Callable:
    """``torch.compile(fn, **compile_options(mode, backend))``. Shapes are
    dynamo's default: static first, dynamic for a size that changed on a
    recompile (the torch backend of MiTA reads block counts on the host:
    with static shapes every new count would recompile)."""
    return torch.compile(fn, **compile_options(mode, backend))


def mark_step() -> None:
    """Tell CUDA-graph trees that a new iteration starts (outputs of the
    previous one may be overwritten)."""
    mark = getattr(torch.compiler, 'cudagraph_mark_step_begin', None)
    if mark is not None:
        mark()


def host_sync(step: Callable[[], object]) -> str:
    """Runs ``step()`` once with CUDA's synchronising calls made errors
    (``torch.cuda.set_sync_debug_mode``); returns the error, or ``''`` if
    the call never waits for the device (reads nothing on the host)."""
    torch.cuda.set_sync_debug_mode('error')
    try:
        step()
    except RuntimeError as error:
        return str(error)
    finally:
        torch.cuda.set_sync_debug_mode('default')
    return ''


def capture_cuda_graph(step: Callable[[], object],
                       warmup: int = 3) -> Tuple[object, object]:
    """Warm ``step()`` up on a side stream, then record one call of it in a
    CUDA graph. Returns ``(graph, result)``: ``graph.replay()`` reruns the
    call, refreshing ``result`` (and every tensor the call wrote, such as
    ``.grad``) in place. A call that synchronises with the host cannot be
    recorded: it raises ``RuntimeError`` before any capture is attempted
    (a capture that fails half-way can leave PyTorch's allocator unusable
    for the rest of the process)."""
    sync = host_sync(step)
    if sync:
        raise RuntimeError('not captured: the call synchronises with the '
                           f'host ({sync.splitlines()[0][:300]})')
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


def forward_backward(attend: Callable, inputs: Sequence[Tensor],
                     grad: Tensor, before: Callable[[], None] = None
                     ) -> Callable[[], Tensor]:
    """A step computing ``attend(*inputs)`` and its backward from ``grad``,
    the input gradients fresh each time (``.grad`` reset to None);
    ``before()`` runs first (e.g. :func:`mark_step`)."""
    def step():
        if before is not None:
            before()
        for t in inputs:
            t.grad = None
        out = attend(*inputs)
        out.backward(grad)
        return out
    return step


def results(out: Tensor, inputs: Sequence[Tensor]) -> List[Tensor]:
    """Copies of the output and of the inputs' gradients."""
    return [out.detach().clone()] + [t.grad.detach().clone() for t in inputs]


def relative_error(got: Sequence[Tensor], want: Sequence[Tensor]) -> float:
    """Largest ``||got - want|| / ||want||`` over the pairs (float32)."""
    return max(float((g.float() - w.float()).norm() /
                     w.float().norm().clamp_min(1e-30))
               for g, w in zip(got, want))
