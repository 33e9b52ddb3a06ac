"""The Triton kernels compile for a CUDA GPU without one.

Triton's ahead-of-time compiler (with the ptxas bundled in the triton wheel)
builds the six kernels for sm_90 (the H200 of the GPU suite) with
the block sizes the backend picks on CUDA, and their shared memory must fit
the 227 KiB of an sm_90 block. This checks what the interpreter does not:
types, layouts, ``tl.dot`` shapes and resources. It runs in a subprocess:
this process has triton in interpreter mode (``conftest.py``).
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip(
    'triton', reason='triton is a test dependency: pip install triton')

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from mmseg_mita.ops import triton_backend as tb

    SMEM_SM90 = 227 * 1024
    TYPES = dict(bf16=torch.bfloat16, fp16=torch.float16,
                 fp32=torch.float32)
    FP32 = ('LSE_R', 'KEY_LOGITS', 'LSE', 'DQ_ACC', 'DK_ACC', 'DV_ACC',
            'DR', 'DVT')
    INDEX = dict(TOPK='*i64', GIVEN='*i64', EXPERT='*i32', SLOTS='*i32',
                 BLOCK_EXPERT='*i32')
    FLOATS = ('qk_scale', 'rl_scale', 'scale')
    KERNELS = (tb._landmarks_fwd, tb._route_and_sort, tb._experts_fwd,
               tb._experts_bwd, tb._shared_bwd, tb._pool_bwd)
    for case in sys.argv[1:]:
        dtype, head_dim = case.split(':')
        cfg = tb._Config(4097, 49, int(head_dim), TYPES[dtype], False)
        consts = dict(BLOCK=cfg.block, CHUNK=cfg.sort_chunk,
                      BLOCK_N=cfg.block_n,
                      BLOCK_L=cfg.block_l, BLOCK_D=cfg.block_d,
                      M_PAD=cfg.m_pad, PRECISION=cfg.precision,
                      UPCAST=False, ROUTE=True)
        for kernel in KERNELS:
            constexprs = {name: value for name, value in consts.items()
                          if name in kernel.arg_names}
            signature = {}
            for name in kernel.arg_names:
                if name in constexprs:
                    signature[name] = 'constexpr'
                elif name in FLOATS:
                    signature[name] = 'fp32'
                elif name in FP32:
                    signature[name] = '*fp32'
                elif name in INDEX:
                    signature[name] = INDEX[name]
                elif name.isupper():
                    signature[name] = '*' + dtype
                else:
                    signature[name] = 'i32'
            compiled = triton.compile(
                ASTSource(kernel, signature, constexprs),
                target=GPUTarget('cuda', 90, 32),
                options=dict(num_warps=cfg.num_warps))
            shared = compiled.metadata.shared
            print(case, kernel.__name__, 'shared', shared)
            assert shared <= SMEM_SM90, (case, kernel.__name__, shared)
''')


def test_kernels_compile_for_sm90(tmp_path, repo_root):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join(
        [repo_root] + [p for p in [env.get('PYTHONPATH')] if p])
    env['TRITON_CACHE_DIR'] = str(tmp_path)  # compile, not a cache hit
    proc = subprocess.run(
        [sys.executable, '-c', SCRIPT, 'bf16:64', 'bf16:128', 'fp32:64'],
        env=env,
        capture_output=True,
        text=True,
        timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count(' shared ') == 18
