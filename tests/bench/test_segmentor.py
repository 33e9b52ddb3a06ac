"""The subcommand ``segmentor``: fps and memory of whole segmentors, eager
and compiled, at tiny sizes (``--scale-down``, models shrunk with
``--cfg-options``; ``torch.compile`` with dynamo's ``eager`` backend)."""
import json

import pytest
import torch

pytest.importorskip('mmseg')
from mmseg_mita.bench import segmentor  # noqa: E402
from mmseg_mita.bench.cli import main  # noqa: E402
from mmseg_mita.bench.measure import tensor_bytes  # noqa: E402
from mmseg_mita.bench.record import cpu_model  # noqa: E402

CBT = ['--heads', 'cbt', '--scale-down', '16', '--repeats', '1',
       '--compile-backend', 'eager', '--cfg-options',
       'model.backbone.num_layers=2', 'model.backbone.embed_dims=64',
       'model.backbone.num_heads=2', 'model.decode_head.in_channels=64',
       'model.decode_head.head_dims=16']


@pytest.fixture(scope='module')
def cbt_run(tmp_path_factory):
    """One run: CBT, whole and sliding-window inference and a training
    step, MiTA and SDPA, eager and compiled; the backbone calls of each
    model counted."""
    calls = {}
    build = segmentor.build

    def counting_build(cfg, device):
        model = build(cfg, device)
        key = (cfg.model.test_cfg.mode, cfg.model.backbone.get('mita_cfg')
               is None, len(calls))
        calls[key] = 0

        def count(module, args):
            calls[key] += 1

        model.backbone.register_forward_pre_hook(count)
        return model

    out = tmp_path_factory.mktemp('segmentor')
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segmentor, 'build', counting_build)
        assert main(['segmentor', '--workloads', 'ade20k-512',
                     'cityscapes-slide', 'ade20k-512-train', '--json',
                     str(out / 's.json'), '--markdown', str(out / 's.md')] +
                    CBT) == 0
    doc = json.loads((out / 's.json').read_text())
    return doc, calls, (out / 's.md').read_text()


def test_every_workload_attention_and_mode_is_measured(cbt_run):
    doc, _, markdown = cbt_run
    rows = doc['rows']
    device = f'{cpu_model()}, {torch.get_num_threads()} threads'
    assert [(r['workload'], r['attention'], r['mode']) for r in rows] == [
        (w, a, m) for w in ('ade20k-512', 'cityscapes-slide',
                            'ade20k-512-train') for a in ('mita', 'sdpa')
        for m in ('eager', 'compiled')]
    for r in rows:
        assert 'error' not in r, r['error']
        assert r['device'] == device and r['fps'] == pytest.approx(
            r['batch'] / r['best_s'])
        assert r['mem_bytes'] == r['kept_bytes'] + r['peak_step_bytes']
        assert r['peak_step_bytes'] > 0
    compiled = [r for r in rows if r['mode'] == 'compiled']
    assert all(r['graph_breaks'] == 0 for r in compiled)
    slide = rows[4]
    assert (slide['size'], slide['crop'], slide['stride']) == (
        [64, 128], [64, 64], [48, 48])
    assert rows[-1]['optimizer'] == 'SGD' and rows[-1]['batch'] == 1
    # one table row per measurement, each naming its device
    lines = [line for line in markdown.splitlines() if line.startswith(
        '| CBT ')]
    assert len(lines) == len(rows) and all(f'| {device} |' in line
                                            for line in lines)
    assert '| 64x128 (slide 64x64, stride 48x48) | inference |' in markdown


def test_ratios_are_over_sdpa_and_over_eager(cbt_run):
    rows = cbt_run[0]['rows']
    fps = {(r['workload'], r['attention'], r['mode']): r['fps']
           for r in rows}
    for r in rows:
        key = (r['workload'], r['attention'], r['mode'])
        assert r['fps_vs_sdpa'] == pytest.approx(
            fps[key] / fps[(r['workload'], 'sdpa', r['mode'])])
        if r['mode'] == 'compiled':
            assert r['compiled_speedup'] == pytest.approx(
                fps[key] / fps[(r['workload'], r['attention'], 'eager')])
        else:
            assert 'compiled_speedup' not in r


def test_memory_counts_the_weights_and_the_optimizer_state(cbt_run):
    rows = {(r['workload'], r['attention'], r['mode']): r
            for r in cbt_run[0]['rows']}
    infer = rows[('ade20k-512', 'mita', 'eager')]
    train = rows[('ade20k-512-train', 'mita', 'eager')]
    from mmseg_mita.bench.segmentors import (attention_variants, build,
                                             load_config)
    from mmseg_mita.bench.workloads import SEGMENTOR_CONFIGS
    options = dict(o.split('=') for o in CBT[CBT.index('--cfg-options') +
                                               1:])
    options = {k: int(v) for k, v in options.items()}
    cfg = load_config(SEGMENTOR_CONFIGS[('cbt', 'ade20k')], options)
    model = build(attention_variants(cfg)['mita'], torch.device('cpu'))
    weights = tensor_bytes(list(model.parameters()) + list(model.buffers()))
    assert infer['kept_bytes'] == weights
    params = tensor_bytes(model.parameters())
    assert train['kept_bytes'] == weights + params  # SGD momentum


def test_sliding_window_runs_the_backbone_once_per_window(cbt_run):
    calls = cbt_run[1]
    # 64 x 128 in 64 x 64 windows at stride 48: 3 windows; a whole image: 1
    # call. Eager: warm-up, memory run, one timed run = 3 steps.
    slide = [n for (mode, full, i), n in calls.items() if mode == 'slide']
    whole = [n for (mode, full, i), n in calls.items() if mode == 'whole']
    assert slide[0] == 3 * 3 and slide[2] == 3 * 3  # eager MiTA, eager SDPA
    assert whole[0] == 3  # eager MiTA at 512 x 512 / 16


def test_upernet_training_step_on_its_config_batch(tmp_path):
    path = tmp_path / 'u.json'
    assert main([
        'segmentor', '--heads', 'upernet', '--workloads', 'ade20k-512-train',
        '--modes', 'eager', '--scale-down', '16', '--repeats', '1',
        '--cfg-options', 'model.backbone.embed_dims=32',
        'model.backbone.num_heads=2', 'model.neck.in_channels=[32,32,32,32]',
        'model.neck.out_channels=32',
        'model.decode_head.in_channels=[32,32,32,32]',
        'model.decode_head.channels=16', 'model.auxiliary_head.in_channels=32',
        'model.auxiliary_head.channels=16', '--json', str(path)]) == 0
    rows = json.loads(path.read_text())['rows']
    assert [(r['attention'], r['optimizer'], r['batch']) for r in rows] == [
        ('mita', 'AdamW', 2), ('sdpa', 'AdamW', 2)]
    assert all(r['fps'] > 0 and 'error' not in r for r in rows)
