"""Every scheme of mmengine's ``CheckpointLoader`` reads through the
plugin's loader (mmseg_mita/checkpoint_schemes.py): a crafted file served
over HTTP on 127.0.0.1, or by a stand-in of each remote backend, is refused
with nothing of it run, where mmengine's own loader of that scheme runs it;
a legitimate file loads as written (a real runner checkpoint from a URL,
downloaded once into torch hub's cache); a scheme registered after the
plugin is refused unless the user opts in."""
import http.server
import json
import os.path as osp
import shutil
import sys
import threading
import types

import mmengine.fileio.io
import pytest
import torch
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

import mmseg_mita.mmseg_plugin  # noqa: F401  (the loaders registered)
from crafted import Call, Global, assert_same, dumps, torch_zip
from mmseg_mita.checkpoint_schemes import SCHEMES, uncovered_schemes
from mmseg_mita.safe_load import (UNSAFE_ENV, UnsafeCheckpointError,
                                  load_checkpoint)

# mmengine 0.10's prefixes, each with its own loader
MMENGINE_PREFIXES = {
    '', 'http://', 'https://', 'pavi://', r'(\S+\:)?s3://',
    r'(\S+\:)?petrel://', 'modelzoo://', 'torchvision://', 'open-mmlab://',
    'openmmlab://', 'mmcls://'
}


@pytest.fixture
def served(tmp_path):
    """(folder, base URL, paths requested): an HTTP server on 127.0.0.1
    serving ``folder`` for the test."""
    folder = tmp_path / 'served'
    folder.mkdir()
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):

        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):  # one per request
            requested.append(self.path)

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f'http://127.0.0.1:{server.server_address[1]}/', \
            requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


class _Model:
    """pavi's model-cloud model, a stand-in: ``download`` copies the
    served file."""

    def __init__(self, folder, path):
        self.name = osp.basename(path)
        self.source = osp.join(folder, self.name)

    def download(self, to):
        shutil.copyfile(self.source, to)


@pytest.fixture
def remote(served, tmp_path, monkeypatch):
    """(folder, {scheme: path to load}): each scheme reaching the files of
    ``folder`` through stand-ins of its backend (pavi's model cloud,
    petrel's client, the model-zoo tables), torch hub's and mmengine's homes
    in ``tmp_path``."""
    folder, url, _ = served
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))
    home = tmp_path / 'mmengine'
    home.mkdir()
    monkeypatch.setenv('MMENGINE_HOME', str(home))
    (home / 'open_mmlab.json').write_text(
        json.dumps({'by_url': url + 'file.pth', 'in_home': 'file.pth'}))

    pavi = types.ModuleType('pavi')
    pavi.modelcloud = types.SimpleNamespace(
        get=lambda path: _Model(folder, path))
    petrel = types.ModuleType('petrel_client')

    class Client:

        def __init__(self, **_):
            pass

        def Get(self, path):  # noqa: N802  (petrel's name)
            with open(osp.join(folder, osp.basename(path)), 'rb') as f:
                return f.read()

    petrel.client = types.SimpleNamespace(Client=Client)
    monkeypatch.setitem(sys.modules, 'pavi', pavi)
    monkeypatch.setitem(sys.modules, 'petrel_client', petrel)
    # mmengine keeps file backends by their arguments: a fresh client
    monkeypatch.setattr(mmengine.fileio.io, 'backend_instances', {})
    table = {'file': url + 'file.pth'}
    for getter in ('get_torchvision_models', 'get_mmcls_models'):
        monkeypatch.setattr(mmengine_checkpoint, getter, lambda: table)
    return folder, {
        'http': url + 'file.pth',
        'pavi': 'pavi://models/file.pth',
        's3': 's3://bucket/file.pth',
        'petrel': 'petrel://bucket/file.pth',
        'cluster:s3': 'cluster:s3://bucket/file.pth',
        'torchvision': 'torchvision://file',
        'modelzoo': 'modelzoo://file',
        'open-mmlab (URL)': 'open-mmlab://by_url',
        'openmmlab (mmengine home)': 'openmmlab://in_home',
        'mmcls': 'mmcls://file',
    }


SCHEME_NAMES = [
    'http', 'pavi', 's3', 'petrel', 'cluster:s3', 'torchvision', 'modelzoo',
    'open-mmlab (URL)', 'openmmlab (mmengine home)', 'mmcls'
]


def _place(folder, data: bytes, tmp_path):
    """``data`` as the file every scheme reaches (mmengine's home too)."""
    (folder / 'file.pth').write_bytes(data)
    shutil.copyfile(folder / 'file.pth', tmp_path / 'mmengine' / 'file.pth')


def test_every_mmengine_scheme_is_covered():
    assert MMENGINE_PREFIXES <= set(CheckpointLoader._schemes)
    assert uncovered_schemes() == {}
    for prefixes, loader in SCHEMES.items():
        for prefix in prefixes:
            assert CheckpointLoader._schemes[prefix] is loader, prefix


@pytest.mark.parametrize('scheme', SCHEME_NAMES)
def test_crafted_file_runs_nothing(scheme, remote, tmp_path, monkeypatch):
    """With torch's ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (what users of
    mmengine 0.10 set to read its checkpoints with torch >= 2.6, and what
    torch < 2.6 does anyway) every loader of mmengine runs the file's code;
    the plugin's run none (the http ones: with any setting)."""
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    folder, paths = remote
    marker = tmp_path / 'marker'
    _place(folder, torch_zip(dumps({
        'w': Call(Global('__builtin__', 'open'), (str(marker), 'w'))
    })), tmp_path)
    with pytest.raises(UnsafeCheckpointError,
                       match=r'unpickling it calls builtins\.open.*'
                       f'{UNSAFE_ENV}=1'):
        CheckpointLoader.load_checkpoint(paths[scheme])
    assert not marker.exists()
    # mmengine's own loader of the scheme runs the file's code
    original = getattr(mmengine_checkpoint,
                       CheckpointLoader._get_checkpoint_loader(
                           paths[scheme]).__name__)
    try:
        original(paths[scheme])
    except Exception:  # noqa: B902  (mmcls: after the code ran)
        pass
    assert marker.exists()


@pytest.mark.parametrize('scheme', SCHEME_NAMES)
def test_legitimate_file_loads_as_written(scheme, remote, tmp_path):
    folder, paths = remote
    want = {'state_dict': {'backbone.w': torch.arange(6.).reshape(2, 3)},
            'meta': {'cfg': "model = dict(type='EncoderDecoder')\n"}}
    torch.save(want, folder / 'saved.pth')
    _place(folder, (folder / 'saved.pth').read_bytes(), tmp_path)
    if scheme == 'mmcls':  # mmengine renames mmcls's keys
        want = mmengine_checkpoint._process_mmcls_checkpoint(want)
    assert_same(CheckpointLoader.load_checkpoint(paths[scheme]), want)


def test_runner_checkpoint_from_a_url_downloads_once(served, trained,
                                                     tmp_path, monkeypatch):
    """A checkpoint tools/train.py wrote, as ``load_from=URL`` reads it:
    what the local file loads as, downloaded into torch hub's cache once."""
    folder, url, requested = served
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))
    shutil.copyfile(osp.join(trained, 'iter_4.pth'), folder / 'iter_4.pth')
    want = load_checkpoint(osp.join(trained, 'iter_4.pth'))
    for _ in range(2):
        assert_same(CheckpointLoader.load_checkpoint(url + 'iter_4.pth'),
                    want)
    assert requested == ['/iter_4.pth']
    assert osp.isfile(tmp_path / 'torch' / 'hub' / 'checkpoints' /
                      'iter_4.pth')


def test_url_naming_no_file_is_an_error(served):
    _, url, requested = served
    with pytest.raises(ValueError, match='names no file'):
        CheckpointLoader.load_checkpoint(url)
    assert requested == []


def test_scheme_registered_later_is_refused(tmp_path, monkeypatch):
    path = str(tmp_path / 'w.pth')
    torch.save({'w': torch.ones(2)}, path)
    monkeypatch.setattr(CheckpointLoader, '_schemes',
                        dict(CheckpointLoader._schemes))

    def load_from_later(filename, map_location=None):
        return torch.load(filename[len('later://'):], weights_only=False)

    CheckpointLoader.register_scheme('later://', load_from_later)
    name = f'{__name__}.{load_from_later.__qualname__}'
    assert uncovered_schemes() == {'later://': name}
    monkeypatch.delenv(UNSAFE_ENV, raising=False)
    with pytest.raises(UnsafeCheckpointError,
                       match=f"its scheme 'later://' is read by {name}"):
        CheckpointLoader.load_checkpoint('later://' + path)
    monkeypatch.setenv(UNSAFE_ENV, '1')
    assert_same(CheckpointLoader.load_checkpoint('later://' + path),
                {'w': torch.ones(2)})
