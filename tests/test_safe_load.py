"""Crafted checkpoints are refused, with a message saying what the file
does, at every entry point (the loader, mmengine's loader as the plugin
registers it, the converters' reader, ``init_cfg=Pretrained``) and by every
tool, leaving no file created, no process crashed or hung, no memory
committed and nothing of torch, numpy, mmengine or argparse changed. Each
file is written as an attacker would (tests/crafted.py: raw opcodes, zip
layouts byte by byte) and tried in a process of its own.
(Legitimate files: tests/test_checkpoint_formats.py.)"""
import functools
import io
import os
import os.path as osp
import pickle
import re
import subprocess
import sys
import tarfile
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Tuple

import numpy as np
import pytest
import torch
from mmengine.runner.checkpoint import CheckpointLoader

import mmseg_mita.mmseg_plugin  # noqa: F401  (mmengine's loader)
from crafted import (ENTRY_POINTS, MARKER, Build, Call, Global,
                     PersistentId, attempt, checkpoint_members,
                     deflated_zeros, dumps, legacy, legacy_storage,
                     local_entry, rebuild_tensor, stored, torch_zip,
                     two_directory_zip, two_zip64_records, zip_archive,
                     zip_storage)
from helpers import DEMO_CONFIG, data_opts
from mmseg_mita.safe_load import UNSAFE_ENV

REFUSED = 'UnsafeCheckpointError'
CORRUPT = 'CorruptCheckpointError'
HISTORY_BUFFER = Global('mmengine.logging.history_buffer', 'HistoryBuffer')
GETATTR = Global('__builtin__', 'getattr')
NUMPY_DTYPE = Global('numpy', 'dtype')
RECONSTRUCT = Global('numpy.core.multiarray', '_reconstruct')
F8_STATE = (3, '<', None, None, None, -1, -1, 0)


class Payload(torch.nn.Module):
    """A TorchScript module whose ``__setstate__`` prints :data:`MARKER`
    (``torch.jit.load`` runs it)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))

    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        print('MMSEG_MITA_RAN_CODE')
        self.w = state[0]
        self.training = state[1]

    def forward(self, x):
        return x


@functools.lru_cache(maxsize=None)
def _torchscript_members():
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)  # torch.jit
        torch.jit.save(torch.jit.script(Payload()), buffer)
    with zipfile.ZipFile(buffer) as archive:
        return [stored(i.filename, archive.read(i))
                for i in archive.infolist()]


def _weights(extra=None, legacy_format=False):
    """A checkpoint: one float tensor ``w`` of 4 zeros, and ``extra``."""
    if legacy_format:
        w = rebuild_tensor(legacy_storage('0', 4), (4, ))
        return legacy(dumps({'state_dict': {'w': w}, **(extra or {})}),
                      ['0'], [(4, bytes(16))])
    w = rebuild_tensor(zip_storage('0', 4), (4, ))
    return torch_zip(dumps({'state_dict': {'w': w}, **(extra or {})}),
                     {'0': bytes(16)})


def _damaged_tensor():
    """The members of a checkpoint whose tensor fails its CRC-32 check."""
    return checkpoint_members(dumps({'w': rebuild_tensor(
        zip_storage('0', 4), (4, ))}), {})[:1] + [
            stored('archive/data/0', b'\xff' * 16)._replace(crc=0)
        ] + checkpoint_members(b'', {})[1:]


def _calling(module, name, *args):
    """A checkpoint calling ``module.name(*args)``."""
    return lambda: _weights({'x': Call(Global(module, name), args)})


def _numpy_array(values, spec='f8', state=F8_STATE):
    data = np.asarray(values, dtype=spec).tobytes()
    dtype = Build(Call(NUMPY_DTYPE, (spec, False, True)), state)
    return Build(Call(RECONSTRUCT, (Global('numpy', 'ndarray'), (0, ), b'b')),
                 (1, (len(values), ), dtype, False, data))


def _history_buffer(**state):
    state = {'max_length': 10, '_log_history': _numpy_array([1.0]),
             '_count_history': _numpy_array([1], 'i8'), **state}
    return {'message_hub': {'log_scalars': {'loss': Build(
        Call(HISTORY_BUFFER, (), new=True), state)}}}


def _methods(**methods):
    return {name: Call(GETATTR, (HISTORY_BUFFER, method))
            for name, method in methods.items()}


def _stride_zero_view():
    """A pos_embed of 16,000,001 x 32 floats on a storage of one (what
    mmseg's position-embedding resize would materialise: 2 GB)."""
    return Call(Global('torch._utils', '_rebuild_tensor_v2'),
                (PersistentId(zip_storage('0', 1)), 0, (16_000_001, 32),
                 (0, 0), False, Call(Global('collections', 'OrderedDict'))))


def _npy(header: dict) -> bytes:
    text = repr(header).encode()
    text += b' ' * (63 - (10 + len(text)) % 64) + b'\n'
    return b'\x93NUMPY\x01\x00' + len(text).to_bytes(2, 'little') + text


def _tar(path):
    with tarfile.open(path, 'w') as archive:
        fifo = tarfile.TarInfo('storages')
        fifo.type = tarfile.FIFOTYPE
        link = tarfile.TarInfo('tensors')
        link.type, link.linkname = tarfile.SYMTYPE, '/etc/passwd'
        archive.addfile(fifo)
        archive.addfile(link)
        pickle_member = tarfile.TarInfo('pickle')
        data = dumps({})
        pickle_member.size = len(data)
        archive.addfile(pickle_member, io.BytesIO(data))


# name -> (file bytes, or a function writing the file; error class; what the
# message must say: a regex, or {entry point: regex} for the .npz entries)
ATTACKS = {
    # code run by unpickling
    'code: open (zip)':
    (_calling('__builtin__', 'open', 'marker', 'w'), REFUSED,
     r'unpickling it calls builtins\.open, which is not admitted'),
    'code: open (legacy format)':
    (lambda: _weights({'x': Call(Global('__builtin__', 'open'),
                                 ('marker', 'w'))}, legacy_format=True),
     REFUSED, r'unpickling it calls builtins\.open, which is not admitted'),
    'code: getattr from HistoryBuffer to its globals':
    (lambda: _weights({'x': Call(GETATTR, (HISTORY_BUFFER, 'update'))}),
     REFUSED, r"calls builtins\.getattr\('HistoryBuffer', 'update'\)"),
    # one file, two zip directories
    'zip: TorchScript archive for torch, a checkpoint for zipfile':
    (lambda: two_directory_zip(_torchscript_members(), checkpoint_members(
        dumps({'w': 1}), {})), REFUSED, 'it is a TorchScript archive'),
    'zip: a damaged tensor for torch, the intact one for zipfile':
    (lambda: two_directory_zip(
        _damaged_tensor(),
        checkpoint_members(dumps({'w': rebuild_tensor(
            zip_storage('0', 4), (4, ))}), {'0': bytes(16)})), REFUSED,
     r'its central directory \(\d+ bytes from byte \d+\) does not end where '
     r'its end records begin'),
    'zip: a damaged tensor for torch, the intact one for zipfile (zip64)':
    (lambda: two_zip64_records(_damaged_tensor(), checkpoint_members(dumps(
        {'w': rebuild_tensor(zip_storage('0', 4), (4, ))}), {'0': bytes(16)})),
     REFUSED, r'its zip64 locator points at byte \d+, not at a zip64 end '
     r'record just before it'),
    'zip: a member with two zip64 size fields':
    (lambda: zip_archive(checkpoint_members(dumps({'w': rebuild_tensor(
        zip_storage('0', 4), (4, ))}), {})[:1] + [stored(
            'archive/data/0', bytes(16))._replace(zip64=(
                (0xFFFFFFFF, 0xFFFFFFFF), (16, 16)))] + checkpoint_members(
                    b'', {})[1:]), REFUSED,
     'member data/0 states 16 bytes stored for 16 bytes of data, with 2 '
     'zip64 fields'),
    'zip: data after the archive':
    (lambda: _weights() + bytes(10), REFUSED,
     'its end record is not its last 22 bytes'),
    'zip: data before the archive':
    (lambda: local_entry(stored('archive/x', bytes(100))) + _weights(),
     CORRUPT, "torch's zip reader"),
    'zip: a member listed twice':
    (lambda: zip_archive(checkpoint_members(dumps({}), {}) + [
        stored('archive/data.pkl', dumps({'x': 1}))]), REFUSED,
     'a member listed twice'),
    'zip: a compressed member':
    (lambda: zip_archive(checkpoint_members(
        dumps({'w': rebuild_tensor(zip_storage('0', 4), (4, ))}), {})[:1] + [
            deflated_zeros('archive/data/0', 16)
        ] + checkpoint_members(b'', {})[1:]), REFUSED,
     'member data/0 is compressed'),
    'zip: a plain TorchScript archive': (lambda: zip_archive(
        _torchscript_members()), REFUSED, 'it is a TorchScript archive'),
    # what the legacy and .tar formats do besides unpickling
    'legacy: a module container writing a .patch file':
    (lambda: legacy(dumps({'m': PersistentId(('module', Build(
        Global('torch._utils', '_rebuild_tensor'),
        (None, {'dump_patches': True, '__name__': '../escaped'})), 'x.py',
        'import os'))}), [], []), REFUSED,
     r"holds the persistent id \('module'"),
    'tar: a FIFO and a symlink member': (_tar, REFUSED,
                                         r'oldest format \(a \.tar'),
    'pickle: protocol 4':
    (lambda: torch_zip(pickle.dumps({'w': 1}, protocol=4)), REFUSED,
     r"its pickle has the opcode b'\\x95', which torch's weights-only "
     'unpickler does not read'),
    'pickle: lists nested 100000 deep':
    (lambda: torch_zip(b'\x80\x02' + b']' * 100000 + b'a' * 99999 + b'.'),
     REFUSED, 'its containers are nested too deeply'),
    # BUILD on what the file may name
    'BUILD: defaults of a tensor rebuild function':
    (lambda: _weights({'x': Build(Global('torch._utils',
                                         '_rebuild_tensor_v2'),
                                  (None, {'__defaults__': (None, )}))}),
     REFUSED, 'weights-only unpickler refused it: Can only build'),
    'BUILD: argparse.Namespace.__init__':
    (lambda: _weights({'x': Build(Global('argparse', 'Namespace'),
                                  (None, {'__init__': None}))}), REFUSED,
     'weights-only unpickler refused it: Can only build'),
    'BUILD: the HistoryBuffer class':
    (lambda: _weights({'x': Build(HISTORY_BUFFER,
                                  (None, {'_statistics_methods': {}}))}),
     REFUSED, 'weights-only unpickler refused it: Can only build'),
    'BUILD: HistoryBuffer.mean':
    (lambda: _weights({'x': Build(Call(GETATTR, (HISTORY_BUFFER, 'mean')),
                                  (None, {'__defaults__': (1, )}))}),
     REFUSED, 'weights-only unpickler refused it: Can only build'),
    # numpy
    'numpy: a dtype with altered flags, then a scalar of it':
    (lambda: _weights({'x': Call(Global('numpy.core.multiarray', 'scalar'),
                                 (Build(Call(NUMPY_DTYPE, ('f8', False, True)),
                                        F8_STATE[:-1] + (63, )),
                                  b'\x41' * 8))}), REFUSED,
     r"numpy\.dtype\('f8'\) gets the state"),
    'numpy: an object dtype':
    (lambda: _weights({'x': _numpy_array([0], 'i8', F8_STATE)._replace(
        state=(1, (1, ), Build(Call(NUMPY_DTYPE, ('O8', False, True)),
                               (3, '|', None, None, None, -1, -1, 63)),
               False, b'\x41' * 8))}), REFUSED,
     r"builds numpy\.dtype\('O8'"),
    'numpy: a structured dtype whose field lies past its size':
    (lambda: _weights({'x': Build(Call(NUMPY_DTYPE, ('V8', False, True)),
                                  (3, '|', None, ('a', ), {'a': (Call(
                                      NUMPY_DTYPE, ('f8', False, True)),
                                      4096)}, 8, 1, 16))}), REFUSED,
     r"builds numpy\.dtype\('V8'"),
    'numpy: an array shorter than its shape':
    (lambda: _weights({'x': _numpy_array([1.0])._replace(state=(
        1, (1000, ), Build(Call(NUMPY_DTYPE, ('f8', False, True)),
                           F8_STATE), False, bytes(8)))}), REFUSED,
     r'array of shape \(1000,\) and dtype float64 \(8000 bytes\) comes '
     'with 8 bytes'),
    'numpy: an empty array with a dimension beyond numpy\'s limit':
    (lambda: _weights({'x': _numpy_array([1.0])._replace(state=(
        1, (0, 10**19), Build(Call(NUMPY_DTYPE, ('f8', False, True)),
                              F8_STATE), False, b''))}), REFUSED,
     r'array of shape \(0, 10000000000000000000\) cannot be built'),
    # HistoryBuffer's shared table of statistics methods
    "HistoryBuffer: 'mean' -> max":
    (lambda: _weights(_history_buffer(statistics_methods=_methods(
        min='min', max='max', current='current', mean='max'))), REFUSED,
     'a HistoryBuffer comes with the statistics methods'),
    "HistoryBuffer: 'mean' -> current":
    (lambda: _weights(_history_buffer(statistics_methods=_methods(
        mean='current'))), REFUSED,
     'a HistoryBuffer comes with the statistics methods'),
    'HistoryBuffer: state beyond its fields':
    (lambda: _weights(_history_buffer(_statistics_methods={})), REFUSED,
     'a HistoryBuffer gets the state'),
    # memory
    'memory: legacy storage of 1.6 GB in a small file':
    (lambda: legacy(dumps({'w': rebuild_tensor(
        legacy_storage('0', 400_000_000), (400_000_000, ))}), ['0'],
        [(400_000_000, b'')]), CORRUPT,
     r'storage 0 claims 1600000000 bytes up to byte \d+ of a file of \d+'),
    'memory: legacy storage claimed, never listed':
    (lambda: legacy(dumps({'w': rebuild_tensor(legacy_storage('0', 4), (4, )),
                           'leak': rebuild_tensor(legacy_storage('1', 4),
                                                  (4, ))}), ['0'],
                    [(4, bytes(16))]), REFUSED,
     r"claim the storages \['1'\] whose data it lacks \(they would load as "
     'uninitialised memory'),
    'memory: legacy storage view past its storage':
    (lambda: legacy(dumps({'w': rebuild_tensor(
        legacy_storage('0', 4, view=('v', 2, 1000)), (4, ))}), ['0'],
        [(4, bytes(16))]), REFUSED, r"storage view \('v', 2, 1000\)"),
    'memory: zip storage claiming more than its record':
    (lambda: torch_zip(dumps({'w': rebuild_tensor(
        zip_storage('0', 10**9), (10**9, ))}), {'0': bytes(16)}), REFUSED,
     'a tensor claims 4000000000 bytes of storage data/0, which holds 16'),
    'memory: zip decompression bomb':
    (lambda: zip_archive(checkpoint_members(dumps({}), {}) + [
        deflated_zeros('archive/data/0', 128 << 20)]), REFUSED,
     r'its members decompress to \d+ bytes, more than 100 times the file'),
    'memory: .npz decompression bomb':
    (lambda: zip_archive([deflated_zeros('w.npy', 128 << 20, _npy(
        {'descr': '<f8', 'fortran_order': False, 'shape': (16 << 20, )}))]),
     REFUSED, r'its members decompress to \d+ bytes'),
    'memory: .npz array claiming more than its data':
    (lambda: zip_archive([stored('w.npy', _npy(
        {'descr': '<f8', 'fortran_order': False, 'shape': (10**9, )}) +
        bytes(16))]), CORRUPT, {
            'load_checkpoint': 'array w.npy claims 8000000000 bytes and '
            'holds 16',
            'converter': 'array w.npy claims 8000000000 bytes',
            'mmengine': r'it is a NumPy \.npz',
            'init_cfg': r'it is a NumPy \.npz'
        }),
    'memory: .npz object array':
    (lambda: zip_archive([stored('w.npy', _npy(
        {'descr': '|O', 'fortran_order': False, 'shape': (1, )}) +
        bytes(8))]), REFUSED, {
            'load_checkpoint': 'array w.npy has the dtype object',
            'converter': 'array w.npy has the dtype object',
            'mmengine': r'it is a NumPy \.npz',
            'init_cfg': r'it is a NumPy \.npz'
        }),
    'memory: torch.FloatTensor(n)':
    (_calling('torch', 'FloatTensor', 10**10), REFUSED,
     r'unpickling it calls torch\.FloatTensor, which is not admitted'),
    'memory: UntypedStorage(n)':
    (_calling('torch.storage', 'UntypedStorage', 10**10), REFUSED,
     r'it calls torch\.storage\.UntypedStorage'),
    'memory: bytearray(n)':
    (_calling('__builtin__', 'bytearray', 10**10), REFUSED,
     r'it calls bytearray\(10000000000,\) \(admitted: bytearray\(bytes\)'),
    'time: punycode of 100000 characters (quadratic)':
    (_calling('_codecs', 'encode', '\u00fc' * 100000, 'punycode'), REFUSED,
     r"it calls _codecs\.encode\('.*', 'punycode'\) \(admitted: "
     r"_codecs\.encode\(text, 'latin1'\)\)"),
    'memory: quantized tensor larger than its storage':
    (lambda: torch_zip(dumps({'w': Call(
        Global('torch._utils', '_rebuild_qtensor'),
        (PersistentId(zip_storage('0', 4, 'QUInt8Storage')), 0, (10**9, ),
         (1, ), (Global('torch', 'per_tensor_affine'), 0.1, 0), False,
         Call(Global('collections', 'OrderedDict'))))}), {'0': bytes(4)}),
     REFUSED, 'a quantized tensor of 1000000000 bytes lies on a storage of '
     '4 bytes'),
    'memory: a stride-0 view of 16000001 x 32 over 4 bytes':
    (lambda: torch_zip(dumps({'pos_embed': _stride_zero_view()}),
                       {'0': bytes(4)}), REFUSED,
     r'a tensor of shape \(16000001, 32\) views 2048000128 bytes of a '
     'storage of 4 bytes'),
    'memory: safetensors offsets past the data':
    (lambda: (lambda header: len(header).to_bytes(8, 'little') + header +
              bytes(16))(b'{"w": {"dtype": "F32", "shape": [1000000000], '
                         b'"data_offsets": [0, 4000000000]}}'), CORRUPT,
     r"tensor 'w' of shape \[1000000000\] does not fill its data_offsets"),
}


def _write(attack, path):
    make = ATTACKS[attack][0]
    if make.__code__.co_argcount:
        make(str(path))
    else:
        path.write_bytes(make())
    return str(path)


@pytest.fixture(scope='module')
def outcomes(tmp_path_factory):
    """{attack: Outcome} of every attack, two at a time."""
    root = tmp_path_factory.mktemp('attacks')
    works = [root / f'attack{i}' for i in range(len(ATTACKS))]
    paths = []
    for work, attack in zip(works, ATTACKS):
        work.mkdir()
        paths.append(_write(attack, work / 'crafted.pth'))
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(ATTACKS, pool.map(
            lambda args: attempt(args[0], str(args[1])), zip(paths, works))))


@pytest.mark.parametrize('name', list(ATTACKS))
def test_crafted_file_is_refused_everywhere(outcomes, name):
    _, error, message = ATTACKS[name]
    outcome = outcomes[name]
    assert outcome.exitcode == 0, (
        f'the attempt crashed or hung ({outcome.exitcode}):\n' +
        outcome.output[-3000:])
    result = outcome.result
    for entry in ENTRY_POINTS:
        kind, text = result[entry]
        pattern = message[entry] if isinstance(message, dict) else message
        assert re.search(pattern, text), (entry, text)
        assert kind == (REFUSED if 'NumPy' in pattern else error), (
            entry, kind, text)
        assert 'crafted.pth' in text and (kind != REFUSED or
                                          f'{UNSAFE_ENV}=1' in text), text
    assert outcome.created == [], outcome.created  # no file written
    assert result['changed'] == []  # torch, numpy, mmengine, argparse
    assert result['canary'], 'a later load read a tensor wrongly'
    assert result['rss_growth_mib'] < 200, result['rss_growth_mib']
    assert MARKER not in outcome.output


def test_two_directory_layouts_are_live(tmp_path):
    """The layouts do what they are meant to: zipfile and torch's reader see
    different archives, and full unpickling runs the TorchScript one's code
    (and loads the damaged tensor without noticing)."""
    for name, check in [
        ('zip: TorchScript archive for torch, a checkpoint for zipfile',
         lambda out: MARKER in out.output),
        ('zip: a damaged tensor for torch, the intact one for zipfile',
         lambda out: out.result['control'] == 'loaded'),
        ('zip: a damaged tensor for torch, the intact one for zipfile '
         '(zip64)', lambda out: out.result['control'] == 'loaded'),
    ]:
        work = tmp_path / str(len(os.listdir(tmp_path)))
        work.mkdir()
        path = _write(name, work / 'crafted.pth')
        with zipfile.ZipFile(path) as archive:
            seen_by_python = archive.namelist()
        with open(path, 'rb') as f:
            seen_by_torch = torch._C.PyTorchFileReader(f).get_all_records()
            f.seek(0)
        assert ('constants.pkl' in seen_by_torch) == ('TorchScript' in name)
        assert not any('constants.pkl' in n for n in seen_by_python)
        assert check(attempt(str(path), str(work), control=True)), name


def test_stride_zero_view_is_live(tmp_path):
    """torch's weights-only unpickler builds the 2 GB view of 4 bytes
    from a file of under 1 KB."""
    path = _write('memory: a stride-0 view of 16000001 x 32 over 4 bytes',
                  tmp_path / 'view.pth')
    assert os.path.getsize(path) < 1024
    assert torch.load(path, weights_only=True)['pos_embed'].shape == (
        16_000_001, 32)


def test_opt_in_loads_a_trusted_file(tmp_path, monkeypatch):
    path = str(tmp_path / 'trusted.pth')
    with open(path, 'wb') as f:  # the marker's path absolute: cwd unchanged
        f.write(_weights({'x': Call(Global('__builtin__', 'open'),
                                    (str(tmp_path / 'marker'), 'w'))}))
    for value in (None, '0', 'yes'):  # only 1 opts in
        if value is None:
            monkeypatch.delenv(UNSAFE_ENV, raising=False)
        else:
            monkeypatch.setenv(UNSAFE_ENV, value)
        with pytest.raises(ValueError, match='refused to load checkpoint'):
            CheckpointLoader.load_checkpoint(path)
        assert not (tmp_path / 'marker').exists()
    monkeypatch.setenv(UNSAFE_ENV, '1')
    with pytest.warns(UserWarning, match='full unpickling'):
        CheckpointLoader.load_checkpoint(path)
    assert (tmp_path / 'marker').exists()


# --- the tools, as users call them (one subprocess per run) ----------------

ENTRY_TOOLS = ['test.py', 'train.py --resume', 'train.py load_from',
               'convert_vit.py', 'export_onnx.py', 'sweep_mk.py',
               'show_experts.py']
TOOL_ATTACKS = {  # attack -> what the tool must print
    'zip: TorchScript archive for torch, a checkpoint for zipfile':
    'it is a TorchScript archive',
    "HistoryBuffer: 'mean' -> max":
    'a HistoryBuffer comes with the statistics methods',
}


def _command(entry, ckpt, work, data_root):
    test_opts = [f'test_dataloader.dataset.data_root={data_root}',
                 'test_dataloader.num_workers=0',
                 'test_dataloader.persistent_workers=False']
    image = osp.join(data_root, 'images', 'validation',
                     sorted(os.listdir(osp.join(data_root, 'images',
                                                'validation')))[0])
    train = ['tools/train.py', DEMO_CONFIG, '--work-dir', work]
    return {
        'test.py': ['tools/test.py', DEMO_CONFIG, ckpt, '--work-dir', work,
                    '--cfg-options'] + test_opts,
        'train.py --resume': train + ['--resume', '--cfg-options'] +
        data_opts(data_root),
        'train.py load_from': train + ['--cfg-options', f'load_from={ckpt}']
        + data_opts(data_root),
        'convert_vit.py': ['tools/convert_vit.py', ckpt,
                           osp.join(work, 'out.pth')],
        'export_onnx.py': ['tools/export_onnx.py', DEMO_CONFIG, ckpt,
                           '--shape', '96', '96', '--out',
                           osp.join(work, 'out.onnx')],
        'sweep_mk.py': ['tools/sweep_mk.py', DEMO_CONFIG, ckpt, '--pool-sizes',
                        '2', '--topks', '4', '--work-dir', work,
                        '--cfg-options'] + test_opts,
        'show_experts.py': ['tools/show_experts.py', DEMO_CONFIG, ckpt, image,
                            '--out', work],
    }[entry]


@pytest.fixture(scope='module')
def tool_runs(repo_root, demo_data, tmp_path_factory):
    """{(tool, attack): (exit status, output)} for the crafted files
    through every tool, two processes at a time."""
    tmp = tmp_path_factory.mktemp('crafted')
    env = {k: v for k, v in os.environ.items() if k != UNSAFE_ENV}

    def run(args):
        (entry, _), work, ckpt = args
        proc = subprocess.run(
            [sys.executable] + _command(entry, ckpt, str(work), demo_data),
            cwd=repo_root, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=600)
        return proc.returncode, proc.stdout

    keys = [(entry, attack) for entry in ENTRY_TOOLS
            for attack in TOOL_ATTACKS]
    runs = []
    for i, (entry, attack) in enumerate(keys):
        work = tmp / f'run{i}'
        work.mkdir()
        ckpt = _write(attack, work / 'crafted.pth')
        (work / 'last_checkpoint').write_text(ckpt)  # what --resume reads
        runs.append(((entry, attack), work, ckpt))
    with ThreadPoolExecutor(2) as pool:  # 2 cores
        return dict(zip(keys, pool.map(run, runs)))


@pytest.mark.parametrize('attack', list(TOOL_ATTACKS))
@pytest.mark.parametrize('entry', ENTRY_TOOLS)
def test_tools_refuse_crafted_checkpoint(tool_runs, entry, attack):
    returncode, out = tool_runs[entry, attack]
    assert returncode == 1, out[-3000:]  # an error, not a crash
    assert 'refused to load checkpoint' in out and \
        TOOL_ATTACKS[attack] in out and f'{UNSAFE_ENV}=1' in out, out[-3000:]
    assert MARKER not in out


def test_an_attempt_whose_status_was_lost_is_tried_once_more(monkeypatch):
    import crafted
    lost = crafted.Outcome(crafted.STATUS_LOST, {'done': True}, '', [])
    tries = []

    def once(outcomes):
        def run(path, work, timeout, control):
            tries.append(path)
            return outcomes[len(tries) - 1]
        return run

    ok = crafted.Outcome(0, {'done': True}, '', [])
    monkeypatch.setattr(crafted, '_attempt_once', once([lost, ok]))
    assert crafted.attempt('f', 'w') == ok and len(tries) == 2
    tries.clear()  # a child that exits with 255 every time is reported
    monkeypatch.setattr(crafted, '_attempt_once', once([lost, lost, ok]))
    assert crafted.attempt('f', 'w') == lost and len(tries) == 2
    for first in (lost._replace(result=None), lost._replace(created=['x']),
                  lost._replace(exitcode=-11)):  # crashed or left a file
        tries.clear()
        monkeypatch.setattr(crafted, '_attempt_once', once([first, ok]))
        assert crafted.attempt('f', 'w') == first and len(tries) == 1
