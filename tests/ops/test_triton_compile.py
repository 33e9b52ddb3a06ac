"""The Triton kernels compile for a CUDA GPU without one.

Triton's ahead-of-time compiler (with the ptxas bundled in the triton wheel)
builds the four kernels for sm_90 (the H200 of ``tools/gpu_check.sh``) with
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

pytest.importorskip('triton',
                    reason='triton is a test dependency: pip install triton')

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
    for case in sys.argv[1:]:
        dtype, head_dim = case.split(':')
        cfg = tb._Config(4097, 49, int(head_dim), TYPES[dtype], False)
        consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_D=cfg.block_d, PRECISION=cfg.precision,
                      UPCAST=False)
        ints = ('num_tiles', 'num_chunks', 'm', 'k', 'd')
        floats = ('qk_scale', 'scale')
        index = dict(KEY_ROWS='*i64', ROWS='*i64', TILES='*i32',
                     CHUNKS='*i32', LSE='*fp32', DELTA='*fp32',
                     DK_ACC='*fp32', DV_ACC='*fp32')
        kernels = [(tb._mita_fwd, {}), (tb._mita_bwd_dq, {}),
                   (tb._mita_bwd_dkv, dict(COMPRESSED=False)),
                   (tb._mita_bwd_dkv, dict(COMPRESSED=True))]
        for kernel, extra in kernels:
            constexprs = dict(consts, **extra)
            signature = {}
            for name in kernel.arg_names:
                if name in constexprs:
                    signature[name] = 'constexpr'
                elif name in ints:
                    signature[name] = 'i32'
                elif name in floats:
                    signature[name] = 'fp32'
                else:
                    signature[name] = index.get(name, '*' + dtype)
            compiled = triton.compile(
                ASTSource(kernel, signature, constexprs),
                target=GPUTarget('cuda', 90, 32),
                options=dict(num_warps=cfg.num_warps))
            shared = compiled.metadata.shared
            print(case, kernel.__name__, extra, 'shared', shared)
            assert shared <= SMEM_SM90, (case, kernel.__name__, shared)
''')


def test_kernels_compile_for_sm90(tmp_path, repo_root):
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join(
        [repo_root] + [p for p in [env.get('PYTHONPATH')] if p])
    env['TRITON_CACHE_DIR'] = str(tmp_path)  # compile, not a cache hit
    proc = subprocess.run(
        [sys.executable, '-c', SCRIPT, 'bf16:64', 'bf16:128', 'fp32:64'],
        env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count('shared') == 12
