"""A checkpoint cannot run code: every loader of the plugin unpickles
through the allow-list of mmseg_mita/safe_load.py, refuses a crafted file
before any of it runs, and still loads every legitimate checkpoint."""
import os
import os.path as osp
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader

import mmseg_mita.mmseg_plugin  # noqa: F401  (mmengine's loader, MiTAViT)
from helpers import DEMO_CONFIG, crafted_checkpoint, data_opts
from mmseg_mita.converters import read_checkpoint
from mmseg_mita.models import MiTAViT
from mmseg_mita.safe_load import UNSAFE_ENV, UnsafeCheckpointError, torch_load

DATA = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'vit')
FORMATS = ['zip', 'legacy']
REFUSED = 'refused to load checkpoint'


@pytest.fixture(params=[(fmt, getattr_) for fmt in FORMATS
                        for getattr_ in (False, True)],
                ids=lambda p: p[0] + ('-getattr' if p[1] else '-open'))
def crafted(request, tmp_path, monkeypatch):
    """(path, marker): a checkpoint whose unpickling creates ``marker``."""
    monkeypatch.delenv(UNSAFE_ENV, raising=False)
    fmt, via_getattr = request.param
    marker = tmp_path / 'marker'
    path = crafted_checkpoint(tmp_path / 'evil.pth', marker,
                              legacy=fmt == 'legacy', via_getattr=via_getattr)
    return path, marker


def _refused(load, path, marker):
    with pytest.raises(UnsafeCheckpointError) as info:
        load()
    assert not marker.exists()
    return str(info.value)


def test_crafted_checkpoint_is_refused_by_every_in_process_loader(crafted):
    path, marker = crafted
    msg = _refused(lambda: torch_load(path), path, marker)
    assert msg.startswith(f'{REFUSED} {path}: unpickling it calls ')
    assert ('io.open' in msg or "builtins.getattr(HistoryBuffer, 'update')"
            in msg)
    assert f'{UNSAFE_ENV}=1' in msg
    # load_from, --resume, tools/test.py: mmengine's loader
    _refused(lambda: CheckpointLoader.load_checkpoint(path), path, marker)
    _refused(lambda: read_checkpoint(path), path, marker)  # converters
    backbone = MiTAViT(img_size=(32, 32), patch_size=8, embed_dims=32,
                       num_layers=1, num_heads=2,
                       init_cfg=dict(type='Pretrained', checkpoint=path))
    _refused(backbone.init_weights, path, marker)


def test_opt_in_loads_a_trusted_file(crafted, monkeypatch):
    path, marker = crafted
    for value in ('0', 'yes'):  # only 1 opts in
        monkeypatch.setenv(UNSAFE_ENV, value)
        _refused(lambda: CheckpointLoader.load_checkpoint(path), path, marker)
    monkeypatch.setenv(UNSAFE_ENV, '1')
    with pytest.warns(UserWarning, match='full unpickling'):
        CheckpointLoader.load_checkpoint(path)
    assert marker.exists()


@pytest.mark.filterwarnings('ignore::DeprecationWarning')  # torch.jit
def test_torchscript_archive_is_refused(tmp_path):
    path = str(tmp_path / 'scripted.pth')
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with pytest.raises(UnsafeCheckpointError, match='TorchScript archive'):
        CheckpointLoader.load_checkpoint(path)


def test_runner_checkpoint_loads_as_written(trained):
    path = osp.join(trained, 'iter_4.pth')
    safe = CheckpointLoader.load_checkpoint(path)
    full = torch.load(path, weights_only=False)
    assert safe.keys() == full.keys()
    for key, value in full['state_dict'].items():
        assert torch.equal(value, safe['state_dict'][key]), key
    hub = safe['message_hub']
    assert hub['runtime_info'] == full['message_hub']['runtime_info']
    for key, buffer in full['message_hub']['log_scalars'].items():
        assert isinstance(hub['log_scalars'][key], HistoryBuffer)
        for a, b in zip(buffer.data, hub['log_scalars'][key].data):
            assert a.tolist() == b.tolist(), key
    assert HistoryBuffer._statistics_methods['mean'] is HistoryBuffer.mean


@pytest.mark.parametrize('name', sorted(os.listdir(DATA)) + ['timm.bin'])
def test_every_fixture_loads(name, tmp_path):
    """timm .pth/.bin/.safetensors, DeiT and MiTA-DeiT (``args``: an
    ``argparse.Namespace``), AugReg .npz, mmpretrain, by the converters'
    reader and, for pickles, by mmengine's loader."""
    path = osp.join(DATA, name)
    if name == 'timm.bin':
        path = shutil.copy(osp.join(DATA, 'vit_timm.pth'), tmp_path / name)
    content = read_checkpoint(str(path))
    assert content
    if name.endswith(('.pth', '.bin')):
        loaded = CheckpointLoader.load_checkpoint(str(path))
        assert loaded.keys() == content.keys()
        if 'args' in content:
            assert type(loaded['args']).__name__ == 'Namespace'


# --- the tools, as users call them (one subprocess per run) ----------------

MITA_DEMO = DEMO_CONFIG
ENTRY_POINTS = ['test.py', 'train.py --resume', 'train.py load_from',
                'convert_vit.py', 'export_onnx.py', 'sweep_mk.py',
                'show_experts.py']


def _command(entry, ckpt, work, data_root):
    test_opts = [f'test_dataloader.dataset.data_root={data_root}',
                 'test_dataloader.num_workers=0',
                 'test_dataloader.persistent_workers=False']
    image = osp.join(data_root, 'images', 'validation',
                     sorted(os.listdir(osp.join(data_root, 'images',
                                                'validation')))[0])
    train = ['tools/train.py', MITA_DEMO, '--work-dir', work]
    return {
        'test.py': ['tools/test.py', MITA_DEMO, ckpt, '--work-dir', work,
                    '--cfg-options'] + test_opts,
        'train.py --resume': train + ['--resume', '--cfg-options'] +
        data_opts(data_root),
        'train.py load_from': train + ['--cfg-options', f'load_from={ckpt}']
        + data_opts(data_root),
        'convert_vit.py': ['tools/convert_vit.py', ckpt,
                           osp.join(work, 'out.pth')],
        'export_onnx.py': ['tools/export_onnx.py', MITA_DEMO, ckpt,
                           '--shape', '96', '96', '--out',
                           osp.join(work, 'out.onnx')],
        'sweep_mk.py': ['tools/sweep_mk.py', MITA_DEMO, ckpt, '--pool-sizes',
                        '2', '--topks', '4', '--work-dir', work,
                        '--cfg-options'] + test_opts,
        'show_experts.py': ['tools/show_experts.py', MITA_DEMO, ckpt, image,
                            '--out', work],
    }[entry]


@pytest.fixture(scope='module')
def tool_runs(repo_root, demo_data, tmp_path_factory):
    """{(entry point, format): (exit status, output, marker exists)} for the
    crafted checkpoint through every tool, a few processes at a time."""
    tmp = tmp_path_factory.mktemp('crafted')
    env = {k: v for k, v in os.environ.items() if k != UNSAFE_ENV}

    def run(key):
        entry, fmt = key
        work = tmp / f'{entry.replace(" ", "_")}-{fmt}'
        work.mkdir()
        marker = work / 'marker'
        ckpt = crafted_checkpoint(work / 'evil.pth', marker,
                                  legacy=fmt == 'legacy')
        (work / 'last_checkpoint').write_text(ckpt)  # what --resume reads
        proc = subprocess.run(
            [sys.executable] + _command(entry, ckpt, str(work), demo_data),
            cwd=repo_root, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=600)
        return proc.returncode, proc.stdout, marker.exists()

    keys = [(entry, fmt) for entry in ENTRY_POINTS for fmt in FORMATS]
    with ThreadPoolExecutor(2) as pool:  # 2 cores
        return dict(zip(keys, pool.map(run, keys)))


@pytest.mark.parametrize('fmt', FORMATS)
@pytest.mark.parametrize('entry', ENTRY_POINTS)
def test_tools_refuse_crafted_checkpoint(tool_runs, entry, fmt):
    returncode, out, marker_exists = tool_runs[entry, fmt]
    assert not marker_exists, out[-3000:]
    assert returncode != 0, out[-3000:]
    assert REFUSED in out and f'{UNSAFE_ENV}=1' in out, out[-3000:]
