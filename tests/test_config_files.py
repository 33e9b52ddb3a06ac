"""The packaged configs found by name (``mmseg_mita.config_path``), the
tools' config argument, the version in its one place."""
import glob
import os.path as osp
import re

import pytest

import mmseg_mita
from mmseg_mita import config_path, list_configs
from mmseg_mita.tools import main, resolve_config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
LEAVES = osp.join(ROOT, 'configs', 'mita_vit')
DEMO = 'mita-vit-mini8_upernet_1xb8-1k_demo-96x96'


def test_every_leaf_config_is_listed_and_found():
    files = sorted(glob.glob(osp.join(LEAVES, '*.py')))
    names = list_configs()
    assert names == [osp.basename(f)[:-3] for f in files]
    for name, file in zip(names, files):
        for asked in (name, name + '.py'):
            path = config_path(asked)
            assert osp.isabs(path) and osp.samefile(path, file)


def test_packaged_configs_load_from_another_directory(tmp_path, monkeypatch):
    from mmengine.config import Config
    monkeypatch.chdir(tmp_path)
    cfg = Config.fromfile(config_path(DEMO), import_custom_modules=False)
    assert cfg.model.backbone.type == 'MiTAViT'
    assert cfg.custom_imports.imports == ['mmseg_mita.mmseg_plugin']


def test_unknown_name_lists_near_matches():
    with pytest.raises(ValueError) as info:
        config_path('mita-vit-s16_upernet_ade20k')
    message = str(info.value)
    assert message.startswith("name='mita-vit-s16_upernet_ade20k' is no")
    assert 'mita-vit-s16_upernet_8xb2-160k_ade20k-512x512' in message
    everything = fr'list_configs\(\) lists all {len(list_configs())}$'
    with pytest.raises(ValueError, match=everything):
        config_path('no-such-config')


def test_missing_config_folder_is_named(tmp_path, monkeypatch):
    from mmseg_mita import config_files
    monkeypatch.setattr(config_files, 'LEAF_DIR', str(tmp_path / 'gone'))
    with pytest.raises(FileNotFoundError, match='configs are missing'):
        config_path(DEMO)


@pytest.mark.parametrize('name', [None, 3, ['a']])
def test_name_must_be_a_string(name):
    with pytest.raises(ValueError, match='name must be a config name'):
        config_path(name)


def test_tools_take_a_file_a_path_or_a_name(tmp_path):
    own = tmp_path / 'own.py'
    own.write_text('')
    assert resolve_config(str(own)) == str(own)
    # a missing path is mmseg's to report, not a name to look up
    assert resolve_config('work/missing.py') == 'work/missing.py'
    assert osp.samefile(resolve_config(DEMO + '.py'),
                        osp.join(LEAVES, DEMO + '.py'))
    with pytest.raises(ValueError, match='is no packaged config'):
        resolve_config('missing.py')


@pytest.mark.parametrize('argv', [[], ['benchmark'], ['--help']])
def test_tools_cli_names_its_tools(argv):
    with pytest.raises(SystemExit, match=r'mmseg_mita.tools \{train,test\}'):
        main(argv)


def test_version_is_the_changelogs_newest():
    with open(osp.join(ROOT, 'CHANGELOG.md'), encoding='utf-8') as f:
        versions = re.findall(r'^## (\d+\.\d+\.\d+)', f.read(), re.M)
    assert versions and versions[0] == mmseg_mita.__version__
