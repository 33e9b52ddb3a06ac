"""Every legitimate checkpoint loads through every in-process entry point of
mmseg_mita/safe_load and equals full unpickling of the same file: runner
checkpoints written by real mmengine runs (AdamW/SGD, LinearLR, PolyLR,
CosineRestartLR, OneCycleLR, EMA, AMP), every tensor dtype torch saves,
numpy values, the legacy format, the model-zoo fixtures, safetensors and
.npz. (Crafted files: tests/test_safe_load.py.)"""
import argparse
import os
import os.path as osp
import shutil
import warnings

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.model import BaseModel
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

import mmseg_mita.mmseg_plugin  # noqa: F401  (mmengine's loader, CPU AMP)
from crafted import assert_same
from mmseg_mita.converters import NpzWeights, read_checkpoint
from mmseg_mita.safe_load import UnsafeCheckpointError, load_checkpoint

DATA = osp.join(osp.dirname(osp.abspath(__file__)), 'data', 'vit')


def _loads_as_saved(path, *, mmengine=True):
    """``path`` through the loader, the converters' reader and (``.pth``)
    mmengine's loader, each equal to full unpickling; returns it."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # TypedStorage, quantized: torch's
        want = torch.load(path, weights_only=False)
        assert_same(load_checkpoint(str(path)), want)
        assert_same(read_checkpoint(str(path)), want)
        if mmengine:
            assert_same(CheckpointLoader.load_checkpoint(str(path)), want)
    return want


# --- runner checkpoints ----------------------------------------------------


class ToyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.register_buffer('steps', torch.zeros((), dtype=torch.long))

    def forward(self, inputs, labels=None, mode='tensor'):
        out = self.linear(torch.stack(inputs))
        if mode == 'loss':
            return {'loss': ((out - torch.stack(labels))**2).mean()}
        return out


RUNS = {
    'adamw-linear-poly-ema':
    dict(optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.01),
         param_scheduler=[
             dict(type='LinearLR', start_factor=0.1, by_epoch=False,
                  begin=0, end=2),
             dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False,
                  begin=2, end=8)
         ],
         custom_hooks=[dict(type='EMAHook')]),
    'sgd-onecycle':
    dict(optimizer=dict(type='SGD', lr=1e-2, momentum=0.9),
         param_scheduler=[
             dict(type='OneCycleLR', eta_max=0.1, total_steps=8,
                  by_epoch=False)
         ]),
    'adamw-cosinerestart-amp':
    dict(optimizer=dict(type='AdamW', lr=1e-2),
         param_scheduler=[
             dict(type='CosineRestartLR', periods=[2, 6],
                  restart_weights=[1, 0.5], eta_min=0.0, by_epoch=False)
         ],
         amp=True),
}


def _runner(name, work_dir, iters, **kwargs):
    run = RUNS[name]
    wrapper = 'AmpOptimWrapper' if run.get('amp') else 'OptimWrapper'
    generator = torch.Generator().manual_seed(0)
    dataset = [
        dict(inputs=torch.randn(2, generator=generator),
             labels=torch.randn(1, generator=generator)) for _ in range(8)
    ]
    return Runner(
        model=ToyModel(), work_dir=str(work_dir),
        experiment_name=f'{name}-{osp.basename(work_dir)}-{iters}',
        train_dataloader=dict(dataset=dataset, batch_size=2,
                              sampler=dict(type='DefaultSampler',
                                           shuffle=True)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        optim_wrapper=dict(type=wrapper, optimizer=run['optimizer']),
        param_scheduler=run['param_scheduler'],
        custom_hooks=run.get('custom_hooks'),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook',
                                           interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        default_scope='mmengine', **kwargs)


@pytest.fixture(scope='module', params=sorted(RUNS))
def runner_checkpoint(request, tmp_path_factory):
    """(run name, work dir, iter_2.pth) of 2 iterations of a real runner;
    the AMP run's checkpoint gets the state of a dynamic loss scaler after
    a step (on the CPU mmengine's wrapper has none: mmseg_mita.compat)."""
    work = tmp_path_factory.mktemp(request.param)
    _runner(request.param, work, 2).train()
    path = str(work / 'iter_2.pth')
    if RUNS[request.param].get('amp'):
        weight = torch.nn.Parameter(torch.ones(()))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler = torch.amp.GradScaler('cpu')
        scaler.scale(weight * 2).backward()
        scaler.step(optimizer)
        scaler.update()
        checkpoint = torch.load(path, weights_only=False)
        checkpoint['optimizer']['loss_scaler'] = scaler.state_dict()
        torch.save(checkpoint, path)
    return request.param, work, path


def test_runner_checkpoint_loads_as_written(runner_checkpoint):
    name, _, path = runner_checkpoint
    table = dict(HistoryBuffer._statistics_methods)
    want = _loads_as_saved(path)
    assert want['message_hub']['log_scalars']  # HistoryBuffer objects
    if name == 'sgd-onecycle':
        assert callable(want['param_schedulers'][0]['anneal_func'])
    if name == 'adamw-linear-poly-ema':
        assert 'ema_state_dict' in want
    if name == 'adamw-cosinerestart-amp':
        assert want['optimizer']['loss_scaler']['scale'] > 0
    assert HistoryBuffer._statistics_methods == table


def test_demo_checkpoint_loads_as_written(trained):
    """The demo config's own checkpoint (tools/train.py)."""
    _loads_as_saved(osp.join(trained, 'iter_4.pth'))


def test_runner_resumes_from_its_checkpoint(runner_checkpoint):
    """``--resume``: optimizer, schedulers and message hub restored by
    mmengine through the loader, and training goes on (its logger computes
    the buffers' means)."""
    name, work, path = runner_checkpoint
    runner = _runner(name, work, 3, load_from=path, resume=True)
    runner.train()
    assert runner.iter == 3
    log = runner.message_hub.get_scalar('train/loss')
    assert len(log.data[0]) == 3 and np.isfinite(log.mean())


# --- tensors, values, numpy ------------------------------------------------


def _every_dtype():
    torch.manual_seed(0)
    values = {
        name: torch.randn(3).to(getattr(torch, name))
        for name in ('float32', 'float64', 'float16', 'bfloat16', 'int8',
                     'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32',
                     'uint64', 'bool', 'complex64', 'complex128',
                     'float8_e4m3fn', 'float8_e5m2')
    }
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # quantized tensors: deprecated
        values.update(
            quint8=torch.quantize_per_tensor(torch.randn(4), 0.1, 3,
                                             torch.quint8),
            qint8_channel=torch.quantize_per_channel(
                torch.randn(2, 3), torch.tensor([0.1, 0.2]),
                torch.tensor([1, 2]), 0, torch.qint8))
    base = torch.randn(4, 3)
    values.update(
        parameter=torch.nn.Parameter(torch.randn(2)),
        view=base[1:, ::2], shared=(base, base.t()),
        conj=torch.randn(2, dtype=torch.complex64).conj(),
        size=torch.Size([2, 3]), dtype=torch.float16,
        device=torch.device('cpu'), cuda_device=torch.device('cuda', 1),
        layout=torch.strided, scalars=(1, 2.5, 3 + 4j, True, None),
        bytes=b'\x00\xff', bytearray=bytearray(b'ab'), sets=({1}, frozenset(
            {2})), text='w\u00e9ight')
    return values


@pytest.mark.parametrize('legacy', [False, True], ids=['zip', 'legacy'])
def test_every_tensor_dtype_and_value_loads(tmp_path, legacy):
    values = _every_dtype()
    if legacy:  # the legacy format has no storage for these dtypes
        values = {k: v for k, v in values.items()
                  if 'float8' not in k and k not in ('uint16', 'uint32',
                                                     'uint64')}
    path = tmp_path / 'values.pth'
    torch.save(values, path, _use_new_zipfile_serialization=not legacy)
    loaded = _loads_as_saved(path)
    shared = load_checkpoint(str(path))['shared']
    assert shared[0].untyped_storage().data_ptr() == \
        shared[1].untyped_storage().data_ptr()


def test_numpy_values_load(tmp_path):
    """numpy as mmengine's message hub holds it (arrays, scalars), every
    admitted dtype, both byte orders and layouts."""
    rng = np.random.default_rng(0)
    arrays = {
        spec: (rng.standard_normal(6) * 10).astype(spec).reshape(2, 3)
        for spec in ('b1', 'i1', 'i2', 'i4', 'i8', 'u1', 'u2', 'u4', 'u8',
                     'f2', 'f4', 'f8', 'c8', 'c16', '>f8', '>i4')
    }
    path = tmp_path / 'numpy.pth'
    torch.save({'arrays': arrays, 'fortran': np.asfortranarray(arrays['f8']),
                'empty': np.zeros((0, 3)), 'zero_dim': np.array(2.5),
                'scalars': [np.float64(1.5), np.int64(-3), np.bool_(True),
                            np.float32(2.0)],
                'dtype': np.dtype('u2')}, path)
    _loads_as_saved(path)


def test_deit_namespace_loads(tmp_path):
    path = tmp_path / 'deit.pth'
    torch.save({'model': {'w': torch.ones(2)},
                'args': argparse.Namespace(lr=1e-3, model='deit_small',
                                           betas=(0.9, 0.999))}, path)
    _loads_as_saved(path)


@pytest.mark.parametrize('name', sorted(os.listdir(DATA)) + ['timm.bin'])
def test_every_fixture_loads(name, tmp_path):
    """timm .pth/.bin/.safetensors, DeiT and MiTA-DeiT (``args``: an
    ``argparse.Namespace``), AugReg .npz, mmpretrain: by the loader, the
    converters' reader and mmengine's loader (an .npz refused there, with
    the command that converts it)."""
    path = osp.join(DATA, name)
    if name == 'timm.bin':
        path = shutil.copy(osp.join(DATA, 'vit_timm.pth'), tmp_path / name)
    path = str(path)
    if name.endswith('.npz'):
        content = read_checkpoint(path)
        assert type(content) is NpzWeights and content
        with np.load(path) as npz:
            assert_same(dict(content), {k: npz[k] for k in npz.files})
        with pytest.raises(UnsafeCheckpointError,
                           match=r'it is a NumPy \.npz .* `python tools/'
                           rf'convert_vit.py {path} OUT.pth`'):
            CheckpointLoader.load_checkpoint(path)
    elif name.endswith('.safetensors'):  # the state dict of vit_timm.pth
        want = torch.load(osp.join(DATA, 'vit_timm.pth'), weights_only=True)
        for got in (read_checkpoint(path),
                    CheckpointLoader.load_checkpoint(path, 'cpu')):
            assert_same(dict(sorted(got.items())), dict(sorted(want.items())))
    else:
        _loads_as_saved(path)
