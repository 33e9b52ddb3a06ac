"""The package installs like a library: a wheel built from this checkout,
installed into a fresh venv outside the repository that already holds the
stack (torch, mmengine, mmcv 2.1.0 with its compiled ops, mmsegmentation
1.2.2), adds itself only, and its packaged configs build and train from
another directory with the repository off ``sys.path``.

The venv gets the torch version of this environment (with only binaries
allowed, from pip's find-links first: a local CPU wheel where the machine
has one) and the mmcv of this environment, repacked into a wheel
(:func:`repack_installed`): the one mmcv known to run with that torch
(mmcv's compiled ops are bound to the torch they were built against, and a
wheel pip built from mmcv's source and cached is not told apart by it),
found on every machine that runs the tests, and installed without a
20-minute build.
"""
import base64
import hashlib
import ast
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import distribution

import pytest
import torch

from helpers import data_opts

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = 'mita-vit-mini8_upernet_1xb8-1k_demo-96x96'
STACK = [
    'torch==' + torch.__version__.split('+')[0], 'mmengine>=0.10.0,<0.11',
    'mmsegmentation==1.2.2', 'ftfy', 'regex'
]
# what pip writes into a dist-info when it installs (not part of a wheel)
INSTALL_MARKERS = {'RECORD', 'INSTALLER', 'REQUESTED', 'direct_url.json'}


def _run(cmd, cwd, message='', timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=timeout,
                          env={k: v for k, v in os.environ.items()
                               if k != 'PYTHONPATH'})
    assert proc.returncode == 0, f'{message}\n{proc.stdout[-4000:]}'
    return proc.stdout


def _pip(python, *args, cwd, **kwargs):
    return _run([python, '-m', 'pip', *args], cwd, **kwargs)


def _find_links(tmp):
    """``--find-links`` for pip: those of pip's configuration files and
    environment (PIP_FIND_LINKS would hide the files' setting)."""
    folders = []
    for line in _pip(sys.executable, 'config', 'list', cwd=tmp).splitlines():
        key, _, value = line.partition('=')
        if key.endswith('.find-links'):
            folders += ast.literal_eval(value).split()
    return [arg for f in dict.fromkeys(folders) for arg in ('-f', f)]


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return 'sha256=' + digest.rstrip(b'=').decode()


def repack_installed(name, folder):
    """A wheel, written to ``folder``, of the distribution ``name`` installed
    in this environment: the files its dist-info RECORD lists within
    site-packages (without ``__pycache__``), its dist-info less pip's
    install markers, and a new RECORD. Returns the wheel's path."""
    dist = distribution(name)
    wheel_info = dist.read_text('WHEEL')
    if wheel_info is None or dist.files is None:
        raise FileNotFoundError(f'{name} was not installed from a wheel '
                                '(its dist-info has no WHEEL or RECORD)')
    tags = [line.split(':', 1)[1].strip().split('-')
            for line in wheel_info.splitlines() if line.startswith('Tag:')]
    tag = '-'.join('.'.join(dict.fromkeys(part)) for part in zip(*tags))
    meta = dist.metadata
    stem = f"{meta['Name'].replace('-', '_')}-{meta['Version']}"
    path = osp.join(folder, f'{stem}-{tag}.whl')
    record, info_dir = [], None
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as archive:
        for file in dist.files:
            parts = file.parts
            if '..' in parts or '__pycache__' in parts:
                continue
            if parts[0].endswith('.dist-info'):
                info_dir = parts[0]
                if len(parts) == 2 and parts[1] in INSTALL_MARKERS:
                    continue
            with open(dist.locate_file(file), 'rb') as f:
                data = f.read()
            archive.writestr(file.as_posix(), data)
            record.append(f'{file.as_posix()},{_record_hash(data)},'
                          f'{len(data)}')
        record.append(f'{info_dir}/RECORD,,')
        archive.writestr(f'{info_dir}/RECORD', '\n'.join(record) + '\n')
    return path


def _tracked_copy(dst):
    """The checkout's files (tracked, or untracked and not ignored) copied
    to ``dst``, links as links: a build there sees no stale build/ or
    egg-info of the editable install."""
    listed = _run(['git', 'ls-files', '-z', '--cached', '--others',
                   '--exclude-standard'], ROOT, 'git could not list files')
    for rel in filter(None, listed.split('\0')):
        src = osp.join(ROOT, rel)
        if osp.lexists(src):
            os.makedirs(osp.dirname(osp.join(dst, rel)), exist_ok=True)
            shutil.copy2(src, osp.join(dst, rel), follow_symlinks=False)


def _installed(python, tmp):
    listed = json.loads(
        _pip(python, 'list', '--format=json', cwd=tmp).splitlines()[-1])
    return {_canonical(p['name']): p['version'] for p in listed}


def _canonical(name):
    return re.sub(r'[-_.]+', '-', name).lower()


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('wheel')
    _tracked_copy(str(tmp / 'src'))
    _pip(sys.executable, 'wheel', '--no-deps', '-w', str(tmp / 'dist'),
         str(tmp / 'src'), cwd=str(tmp), message='pip wheel failed')
    found = os.listdir(tmp / 'dist')
    assert len(found) == 1 and found[0].endswith('.whl'), found
    return str(tmp / 'dist' / found[0])


@pytest.fixture(scope='module')
def venv(wheel, tmp_path_factory):
    """A fresh venv with the stack, then the wheel: its python, what the
    wheel's install would have installed, pip's list before and after."""
    tmp = str(tmp_path_factory.mktemp('venv'))
    _run([sys.executable, '-m', 'venv', osp.join(tmp, 'venv')], tmp)
    python = osp.join(tmp, 'venv', 'bin', 'python')
    mmcv = repack_installed('mmcv', tmp)
    _pip(python, 'install', '--disable-pip-version-check', '-c',
         osp.join(ROOT, 'scripts', 'constraints.txt'), '--only-binary',
         'torch', *_find_links(tmp), *STACK, mmcv, cwd=tmp,
         message=f'the stack did not install into a fresh venv ({STACK}, '
         f'{mmcv})')
    before = _installed(python, tmp)
    report = osp.join(tmp, 'report.json')
    _pip(python, 'install', '--dry-run', '--report', report, wheel, cwd=tmp)
    with open(report) as f:
        would_install = [(_canonical(i['metadata']['name']),
                          i['metadata']['version'])
                         for i in json.load(f)['install']]
    _pip(python, 'install', wheel, cwd=tmp)
    return dict(python=python, cwd=tmp, would_install=would_install,
                before=before, after=_installed(python, tmp))


def test_wheel_holds_the_package_and_every_config(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    configs = {
        osp.relpath(osp.join(d, f), ROOT)
        for d, _, files in os.walk(osp.join(ROOT, 'configs')) for f in files
    }
    assert {'mmseg_mita/.mim/' + c for c in configs} <= names
    modules = {
        osp.relpath(osp.join(d, f), ROOT)
        for d, _, files in os.walk(osp.join(ROOT, 'mmseg_mita'))
        for f in files if f.endswith('.py')
    }
    assert modules <= names


def test_repacked_wheel_holds_the_installed_distribution(tmp_path):
    path = repack_installed('mmcv', str(tmp_path))
    assert osp.basename(path).startswith('mmcv-2.1.0-cp3')
    dist = distribution('mmcv')
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        names = set(archive.namelist())
        record = archive.read('mmcv-2.1.0.dist-info/RECORD').decode()
        listed = {}
        for line in record.splitlines():
            name, digest, size = line.rsplit(',', 2)
            listed[name] = digest, size
        for name in names - {'mmcv-2.1.0.dist-info/RECORD'}:
            data = archive.read(name)
            assert listed.pop(name) == (_record_hash(data), str(len(data)))
            with open(dist.locate_file(name), 'rb') as f:
                assert f.read() == data, name
    assert listed == {'mmcv-2.1.0.dist-info/RECORD': ('', '')}
    assert {'mmcv-2.1.0.dist-info/WHEEL', 'mmcv-2.1.0.dist-info/METADATA',
            'mmcv/ops/__init__.py'} <= names
    assert any(re.fullmatch(r'mmcv/_ext\..*\.so', n) for n in names)
    assert not names & {'mmcv-2.1.0.dist-info/' + m
                        for m in INSTALL_MARKERS - {'RECORD'}}


def test_wheel_adds_only_itself(venv):
    import mmseg_mita
    assert venv['would_install'] == [('mmseg-mita', mmseg_mita.__version__)]
    added = dict(venv['after'])
    assert added.pop('mmseg-mita') == mmseg_mita.__version__
    assert added == venv['before']  # no second torch, nothing replaced


def test_installed_package_builds_a_config_model_anywhere(venv):
    code = (
        'import sys, torch\n'
        'import mmcv.ops, mmseg_mita, mmseg_mita.mmseg_plugin\n'
        'from importlib.metadata import version\n'
        'from mmengine.config import Config\n'
        'from mmengine.registry import init_default_scope\n'
        'from mmseg.registry import MODELS, TRANSFORMS\n'
        'assert MODELS.get("CBTHead") and TRANSFORMS.get("CheckSegMap")\n'
        'assert mmseg_mita.__file__.startswith(sys.prefix), '
        'mmseg_mita.__file__\n'
        'assert version("mmseg_mita") == mmseg_mita.__version__\n'
        f'cfg = Config.fromfile(mmseg_mita.config_path({DEMO!r}))\n'
        'init_default_scope("mmseg")\n'
        'torch.manual_seed(0)\n'
        'model = MODELS.build(cfg.model).eval()\n'
        'with torch.no_grad():\n'
        '    out = model(torch.randn(2, 3, 96, 96), mode="tensor")\n'
        'print(type(model.backbone.layers[0].attn).__name__, '
        'tuple(out.shape), bool(out.isfinite().all()))\n')
    out = _run([venv['python'], '-I', '-c', code], venv['cwd'])
    # the logits of the 5 demo classes at stride 4
    assert out.splitlines()[-1] == 'MiTAMultiheadAttention (2, 5, 24, 24) True'


def test_installed_package_trains_a_config_by_name(venv, demo_data):
    work_dir = osp.join(venv['cwd'], 'work')
    out = _run([
        venv['python'], '-I', '-m', 'mmseg_mita.tools', 'train', DEMO,
        '--work-dir', work_dir, '--cfg-options'
    ] + data_opts(demo_data), venv['cwd'], 'training failed')
    assert osp.isfile(osp.join(work_dir, 'iter_4.pth'))
    assert re.search(r'mIoU: [0-9.]+', out)
