"""The mutation pass of docs/testing.md: each one-line mutation is applied
alone to a fresh clone of this checkout's HEAD, the tests named for it run
(stopping at the first failure) and the change is reverted. Prints one line
per mutation: CAUGHT (with the first failing test) or MISSED.

    .venv/bin/python scripts/mutation_pass.py   # about 5 min on 2 cores
"""
import os.path as osp
import subprocess
import sys
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
VIT = 'mmseg_mita/models/backbones/mita_vit.py'
OP = 'mmseg_mita/ops/mita_attention.py'
TRITON = 'mmseg_mita/ops/triton_backend.py'
LAYER_TEST = ['tests/models/test_mita_vit.py']
CHECK_TEST = ['tests/ops/test_dropout_and_checks.py']
TRITON_TEST = ['tests/ops/test_triton_backend.py']
POOL_CHECK = 'if pool_size[0] > hw[0] or pool_size[1] > hw[1]:'
# name, file, old (must occur once), new, tests
MUTATIONS = [
    ('MiTA layer residual from its normalised input', VIT,
     'identity = query if identity is None else identity', 'identity = query',
     LAYER_TEST),
    ('patch grid handed to the layers as (W, H)', VIT,
     'layer.attn.hw_shape = tuple(hw_shape)',
     'layer.attn.hw_shape = tuple(hw_shape)[::-1]', LAYER_TEST),
    ('num_extra_tokens fixed to 1', VIT,
     'num_extra_tokens = 1 if self.with_cls_token else 0',
     'num_extra_tokens = 1', LAYER_TEST),
    ('attention dropout in eval mode', VIT,
     'dropout_p = mha.dropout if self.training else 0.0',
     'dropout_p = mha.dropout', LAYER_TEST),
    ('pool-size check along H only', OP, POOL_CHECK,
     'if pool_size[0] > hw[0]:', CHECK_TEST),
    ('pool-size check along W only', OP, POOL_CHECK,
     'if pool_size[1] > hw[1]:', CHECK_TEST),
    ('dropout probability not passed to flash-attn',
     'mmseg_mita/ops/flash_backend.py',
     'keys_per_expert, dropout_p=dropout_p,',
     'keys_per_expert, dropout_p=0.0,', CHECK_TEST),
    ('dropout without its 1 / (1 - p) rescale (torch backend)',
     'mmseg_mita/ops/torch_backend.py', 'used = used * mask / (1 - dropout_p)',
     'used = used * mask', CHECK_TEST),
    ('bit-flipped checkpoint not reported (converter loader)',
     'mmseg_mita/converters/loading.py', '    damage = zip_damage(path)\n',
     '    damage = None\n', ['tests/converters/test_convert_vit.py']),
    ("bit-flipped checkpoint not reported (mmengine's loader)",
     'mmseg_mita/compat.py', '    damage = zip_damage(filename)\n',
     '    damage = None\n', ['tests/test_bad_input.py']),
    ('FLOPs closed form without the routing matmul',
     'mmseg_mita/analysis/flop_handles.py', 'mita_routing=m * n * c,',
     'mita_routing=0,', ['tests/analysis/test_flops.py']),
    ('Triton softmax backward with the wrong sign', TRITON,
     'return p * (dp - delta[:, None])', 'return p * (dp + delta[:, None])',
     TRITON_TEST),
    ('Triton online softmax without rescaling its accumulator', TRITON,
     'acc = acc * alpha[:, None] + _dot(', 'acc = acc + _dot(', TRITON_TEST),
    ('Triton pooling bins end at floor (no overlap)', TRITON,
     'return (bi * hgt // ph, ((bi + 1) * hgt + ph - 1) // ph,',
     'return (bi * hgt // ph, (bi + 1) * hgt // ph,', TRITON_TEST),
    ('Triton routing argmax over the padding experts too', TRITON,
     "scores = tl.where(e_mask[None, :], scores, -float('inf'))",
     'scores = scores', TRITON_TEST),
    ('Triton counting sort rank counts the query itself', TRITON,
     'rank = tl.cumsum(one_hot, 0) - one_hot', 'rank = tl.cumsum(one_hot, 0)',
     TRITON_TEST),
    ('Triton blocks per expert off by one (floor)', TRITON,
     'blocks = (counts + BLOCK - 1) // BLOCK', 'blocks = counts // BLOCK',
     TRITON_TEST),
    ('Triton pooling backward into the extra tokens too', TRITON,
     'member = member & l_mask[:, None] & is_patch[None, :]',
     'member = member & l_mask[:, None]', TRITON_TEST),
    ('Triton float32 dots on tf32', TRITON,
     "self.precision = 'ieee' if dtype == torch.float32 else 'tf32'",
     "self.precision = 'tf32'", TRITON_TEST),
    ('Triton head_dim 128 refused', TRITON, 'if q.shape[-1] > MAX_HEAD_DIM:',
     'if q.shape[-1] >= MAX_HEAD_DIM:', TRITON_TEST),
]


def run_tests(clone, tests):
    return subprocess.run([
        sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:warnings', '-p',
        'no:cacheprovider', *tests
    ],
                          cwd=clone,
                          capture_output=True,
                          text=True)


def main():
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        clone = osp.join(tmp, 'clone')
        subprocess.run(['git', 'clone', '-q', REPO, clone], check=True)
        for name, path, old, new, tests in MUTATIONS:
            target = osp.join(clone, path)
            with open(target) as f:
                source = f.read()
            if source.count(old) != 1:
                sys.exit(f'{name}: {old!r} is not in {path} exactly once; '
                         'update the mutation to the code')
            with open(target, 'w') as f:
                f.write(source.replace(old, new))
            try:
                result = run_tests(clone, tests)
            finally:
                with open(target, 'w') as f:
                    f.write(source)
            lines = result.stdout.strip().splitlines() or ['(no output)']
            failed = [line for line in lines if line.startswith('FAILED')]
            if result.returncode == 0:
                missed += 1
                print(f'MISSED  {name}: {lines[-1]}', flush=True)
            else:
                print(f'CAUGHT  {name}: {(failed or lines)[0]}', flush=True)
    sys.exit(1 if missed else 0)


if __name__ == '__main__':
    main()
