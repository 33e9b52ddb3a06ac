"""Graph-captured MiTA equals eager MiTA on CUDA, forward and gradients:
``torch.compile(mode='reduce-overhead')`` (both backends) and a whole
forward+backward recorded in one ``torch.cuda.CUDAGraph`` and replayed on
new input values (Triton backend; the torch backend reads device values on
the host, which a CUDA graph cannot record). float32, relative error of
the output and of the q, k, v gradients to eager on the same values:
``1e-4`` compiled (inductor may reorder the sums of the PyTorch part),
``1e-5`` replayed (the same kernels; the Triton backward adds with
atomics). Skipped without CUDA; run by the GPU suite (``python -m
mmseg_mita.bench gpu``)."""
import functools
import importlib.util

import pytest
import torch

from mmseg_mita.bench.graphs import (capture_cuda_graph, compiled,
                                     forward_backward, mark_step,
                                     relative_error, reset_compiler, results)
from mmseg_mita.ops import mita_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device')
# Triton first: the cheap checks run before a slow compile of the torch
# backend (graph breaks at its host reads) can use up the suite's limit.
BACKENDS = (['triton'] if importlib.util.find_spec('triton') else []) + [
    'torch']
HW, EXTRA = (16, 20), 1


def _inputs(seed):
    gen = torch.Generator(device='cpu').manual_seed(seed)
    shape = (2, 3, EXTRA + HW[0] * HW[1], 64)
    q, k, v, grad = (torch.randn(shape, generator=gen).cuda()
                     for _ in range(4))
    return [t.requires_grad_() for t in (q, k, v)], grad


def _attend(backend):
    return functools.partial(mita_attention, hw=HW, num_extra_tokens=EXTRA,
                             pool_size=4, topk=24, backend=backend)


def _refresh(inputs, seed):
    gen = torch.Generator(device='cpu').manual_seed(seed)
    with torch.no_grad():
        for t in inputs:
            t.copy_(torch.randn(t.shape, generator=gen))


@pytest.mark.skipif('triton' not in BACKENDS, reason='needs triton')
def test_cuda_graph_replay_equals_eager():
    inputs, grad = _inputs(0)
    eager = forward_backward(_attend('triton'), inputs, grad)
    graph, out = capture_cuda_graph(eager)
    grads = [t.grad for t in inputs]  # written by every replay
    for seed in (1, 2):  # new values in the captured inputs
        _refresh(inputs, seed)
        graph.replay()
        got = [x.clone() for x in [out] + grads]
        assert relative_error(got, results(eager(), inputs)) <= 1e-5


@pytest.mark.parametrize('backend', BACKENDS)
def test_compiled_equals_eager(backend):
    reset_compiler()
    inputs, grad = _inputs(0)
    eager = forward_backward(_attend(backend), inputs, grad)
    run = forward_backward(compiled(_attend(backend)), inputs, grad,
                           before=mark_step)
    for seed in (1, 2, 3):  # compile, record, replay
        _refresh(inputs, seed)
        got = results(run(), inputs)
        assert relative_error(got, results(eager(), inputs)) <= 1e-4
