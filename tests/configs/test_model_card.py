"""configs/mita_vit/README.md and metafile.yaml describe every config."""
import glob
import os.path as osp
import re

import pytest
import torch
import yaml
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS

from mmseg_mita.analysis import segmentor_complexity

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CARD = osp.join(ROOT, 'configs', 'mita_vit')
CONFIGS = sorted(
    osp.basename(p) for p in glob.glob(osp.join(CARD, '*.py')))


def _models():
    with open(osp.join(CARD, 'metafile.yaml')) as f:
        return {m['Name']: m for m in yaml.safe_load(f)['Models']}


def test_metafile_lists_every_config():
    models = _models()
    assert sorted(f'{name}.py' for name in models) == CONFIGS
    for name, model in models.items():
        assert model['Config'] == f'configs/mita_vit/{name}.py'
        assert model['In Collection'] == 'MiTA-ViT'


def test_readme_links_every_config():
    with open(osp.join(CARD, 'README.md')) as f:
        linked = re.findall(r'\[config\]\(([^)]+)\)', f.read())
    assert sorted(linked) == CONFIGS


@pytest.mark.parametrize('name', [c for c in CONFIGS if 'demo' in c])
def test_demo_flops_and_params_are_the_counted_ones(name):
    meta = _models()[name[:-3]]['Metadata']
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(osp.join(CARD, name)).model).eval()
    counted = segmentor_complexity(model, (96, 96))
    assert meta['FLOPs (G)'] == round(counted['flops'] / 1e9, 2)
    assert meta['Parameters (M)'] == round(counted['params'] / 1e6, 2)


def test_ade20k_flops_and_params_are_those_of_docs_flops():
    """The card repeats docs/flops.md's table (tools/get_flops.py on every
    ADE20K config, too slow to rerun in the tests)."""
    with open(osp.join(ROOT, 'docs', 'flops.md')) as f:
        rows = [[c.strip() for c in line.strip().strip('|').split('|')]
                for line in f if 'ade20k' in line and '|' in line]
    table = {
        cells[0][:-3]: (float(cells[2]), float(cells[7]))
        for cells in rows if len(cells) == 8
    }
    ade20k = {name: model['Metadata'] for name, model in _models().items()
              if 'ade20k' in name}
    assert sorted(table) == sorted(ade20k)
    for name, meta in ade20k.items():
        assert (meta['FLOPs (G)'], meta['Parameters (M)']) == table[name]
