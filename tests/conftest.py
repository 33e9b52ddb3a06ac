import os
import os.path as osp

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# Without a GPU the Triton kernels run in Triton's interpreter: the variable
# only takes effect before triton is first imported, and test modules
# import it indirectly (``torch.utils.flop_counter`` imports triton), so it
# is set here, before any test module is collected. With CUDA the kernels
# are compiled and the CUDA tests run them (``ops/test_cuda_backends.py``).
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


@pytest.fixture(scope='session')
def repo_root():
    return ROOT


@pytest.fixture(scope='session')
def demo_data(tmp_path_factory):
    """A small demo dataset in ADE20K's layout, shared by the session."""
    from mmseg_mita.datasets.demo_data import make_dataset
    out = str(tmp_path_factory.mktemp('data') / 'demo_ade')
    make_dataset(out, num_train=16, num_val=4, size=96, seed=0)
    return out


@pytest.fixture(scope='session')
def trained(repo_root, demo_data, tmp_path_factory):
    """Work dir of the demo config trained for 4 iterations by
    tools/train.py (``iter_4.pth``; validated at the end)."""
    from helpers import DEMO_CONFIG, data_opts, run_python
    work_dir = str(tmp_path_factory.mktemp('work'))
    run_python(repo_root, ['tools/train.py', DEMO_CONFIG, '--work-dir',
                           work_dir, '--cfg-options'] + data_opts(demo_data))
    return work_dir


@pytest.fixture(scope='session')
def triton_cache(tmp_path_factory):
    """One triton cache dir for the session's ahead-of-time compiles
    (identical compiles hit it)."""
    return str(tmp_path_factory.mktemp('triton_cache'))
