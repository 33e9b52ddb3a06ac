"""Multi-process training through mmengine's launchers, on CPU (gloo)."""
import math
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest
import torch

from helpers import PROBE_ENV, data_opts, probe_config, run


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def two_rank_run(repo_root, demo_data, tmp_path_factory):
    """The demo config trained for 4 iterations by 2 processes through
    tools/dist_train.sh (torchrun, --launcher pytorch)."""
    tmp = tmp_path_factory.mktemp('dist')
    work_dir = str(tmp / 'work')
    config = probe_config(tmp)
    out = run(repo_root, [
        'bash', 'tools/dist_train.sh', config, '2', '--work-dir', work_dir,
        '--cfg-options'
    ] + data_opts(demo_data),
              env={**PROBE_ENV, 'PYTHON': sys.executable,
                   'PORT': str(_free_port())})
    probes = [
        torch.load(osp.join(work_dir, f'probe_rank{r}.pth'))
        for r in range(2)
    ]
    return out, probes


def test_ranks_end_with_identical_parameters(two_rank_run):
    out, (rank0, rank1) = two_rank_run
    assert 'Distributed launcher: pytorch' in out
    assert 'GPU number: 2' in out  # mmengine's name for the world size
    assert rank0['params'].keys() == rank1['params'].keys()
    for name, param in rank0['params'].items():
        assert torch.equal(param, rank1['params'][name]), name


def test_losses_are_finite_and_differ_between_ranks(two_rank_run):
    _, probes = two_rank_run
    for probe in probes:
        assert len(probe['losses']) == 4
        assert all(math.isfinite(loss) for loss in probe['losses'])
    # each rank computes its loss on its own samples
    assert probes[0]['losses'] != probes[1]['losses']


def test_data_is_sharded(two_rank_run, demo_data):
    _, probes = two_rank_run
    seen = [[p for batch in probe['samples'] for p in batch]
            for probe in probes]
    # 4 iterations x batch 2 x 2 ranks = the 16 training images, once each
    assert len(seen[0]) == len(seen[1]) == 8
    assert not set(seen[0]) & set(seen[1])
    images = osp.join(demo_data, 'images', 'training')
    assert len(set(seen[0]) | set(seen[1])) == 16
    assert all(p.startswith(images) for p in seen[0] + seen[1])


SLURM_TASK = """
import atexit
import torch
import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
from mmengine.dist import all_reduce, get_rank, get_world_size, init_dist
# atexit runs handlers last-in first-out: this one after the plugin's
atexit.register(lambda: print('GROUP AT EXIT',
                              torch.distributed.is_initialized()))
init_dist('slurm', backend='nccl')  # mmseg's default backend
x = torch.tensor([get_rank() + 1.0])
all_reduce(x)
print('RESULT', torch.distributed.get_backend(), get_world_size(), x.item())
"""


def test_slurm_launcher_without_cuda(repo_root):
    """mmengine's slurm launcher on CPU, with srun's environment faked."""
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, '-c', SLURM_TASK], cwd=repo_root,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={
                **os.environ,
                'SLURM_PROCID': str(rank), 'SLURM_LOCALID': str(rank),
                'SLURM_NTASKS': '2', 'SLURM_NODELIST': 'localhost',
                'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': port
            }) for rank in range(2)
    ]
    outs = [proc.communicate(timeout=300)[0] for proc in procs]
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out[-3000:]
        assert 'RESULT gloo 2 3.0' in out, out[-3000:]
        # destroyed before exit: a live gloo group aborts the process now
        # and then while the interpreter shuts down
        assert 'GROUP AT EXIT False' in out, out[-3000:]
