"""``torch.compile`` of a segmentor's network: the config switch
``compile=True`` (mmengine's, made to compile the network's forward and
not the optimizer step) and :mod:`mmseg_mita.models.compile`."""
import os
import os.path as osp
import re
import warnings

import pytest
import torch
from mmengine.config import Config

import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
from helpers import (DEMO_CONFIG, PROBE_ENV, ROOT, build_segmentor,
                     data_opts, probe_config, run_python)
from mmseg_mita.models.compile import (compile_network, compile_options,
                                       network_parts)


def _demo_segmentor():
    return build_segmentor(Config.fromfile(osp.join(ROOT, DEMO_CONFIG)).model)


def test_compile_options_of_the_config_value():
    assert compile_options(True) == {}
    assert compile_options(dict(backend='eager')) == dict(backend='eager')
    with pytest.raises(ValueError, match="compile='yes': give True or a"):
        compile_options('yes')
    with pytest.raises(ValueError, match=r"takes no \['backnd'\]"):
        compile_options(dict(backnd='eager'))


@pytest.mark.parametrize('version,refused', [('2.12.1', True),
                                              ('2.6.0+cu124', True),
                                              ('2.13.0', False)])
def test_compile_needs_its_minimum_torch(monkeypatch, version, refused):
    from torch.torch_version import TorchVersion
    monkeypatch.setattr(torch, '__version__', TorchVersion(version))
    model = _demo_segmentor()
    if refused:
        with pytest.raises(RuntimeError, match=r'needs torch >= 2\.13 '
                           rf'\(this is {re.escape(version)};'):
            compile_network(model, backend='eager')
    else:
        assert compile_network(model, backend='eager')[0] == 'backbone'
    torch._dynamo.reset()


def test_the_network_parts_are_compiled_not_the_data_preprocessor():
    model = _demo_segmentor()
    assert [name for name, _ in network_parts(model)] == [
        'backbone', 'neck', 'decode_head', 'auxiliary_head']
    heads = torch.nn.ModuleList([model.decode_head, model.auxiliary_head])
    model.auxiliary_head = heads  # a list of heads: each one compiled
    assert [name for name, _ in network_parts(model)][-2:] == [
        'auxiliary_head.0', 'auxiliary_head.1']

    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        want = model(x, mode='tensor')
    model = _demo_segmentor()
    assert compile_network(model, backend='eager') == [
        'backbone', 'neck', 'decode_head', 'auxiliary_head']
    torch._dynamo.reset()
    with torch.no_grad():
        got = model(x, mode='tensor')
    torch.testing.assert_close(got, want)


def test_no_graph_break_in_the_decode_head():
    model = _demo_segmentor()
    with torch.no_grad():
        features = model.extract_feat(torch.randn(1, 3, 96, 96))
    torch._dynamo.reset()
    explain = torch._dynamo.explain(model.decode_head)(features)
    assert (explain.graph_count, explain.graph_break_count) == (1, 0)


def test_no_graph_break_inside_a_mita_layer():
    model = _demo_segmentor()
    layer = model.backbone.layers[0]
    assert layer.attn.mita is not None
    x = torch.randn(2, 1 + 12 * 12, 96)
    # dynamo warns once per process and message: forget what it has warned.
    torch._dynamo.utils.warn_once_cache.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for hw in ((12, 12), (9, 16), (3, 4)):  # (3, 4): options fitted
            torch._dynamo.reset()
            explain = torch._dynamo.explain(layer)(
                x[:, :1 + hw[0] * hw[1]], hw_shape=hw)
            assert (explain.graph_count,
                    explain.graph_break_count) == (1, 0)
    # Nothing in a layer that dynamo must skip or warn about (a cached
    # function, for one, which it traces without the cache).
    assert not [str(w.message) for w in caught
                if 'Dynamo' in str(w.message)]
    torch._dynamo.reset()
    explain = torch._dynamo.explain(model.backbone)(torch.randn(2, 3, 96, 96))
    assert (explain.graph_count, explain.graph_break_count) == (1, 0)


def _losses(repo_root, demo_data, work_dir, options=()):
    """The losses of the demo config's first 2 training iterations (probe;
    no validation)."""
    work_dir.mkdir()
    config = probe_config(work_dir)
    # the plugin of this checkout (not an installed copy) and train_probe
    env = dict(PYTHONPATH=os.pathsep.join([ROOT, PROBE_ENV['PYTHONPATH']]))
    out = run_python(repo_root, [
        'tools/train.py', config, '--work-dir', str(work_dir),
        '--cfg-options'] + data_opts(demo_data) + [
            'train_cfg.max_iters=2', 'train_cfg.val_begin=3'] + list(options),
        env=env)
    probe = torch.load(osp.join(work_dir, 'probe_rank0.pth'),
                       weights_only=False)
    return probe['losses'], out


def test_compiled_training_equals_eager(repo_root, demo_data, tmp_path):
    # dynamo + AOTAutograd ('aot_eager'): the graphs inductor would get,
    # forward and backward, without its C++ compile (minutes on 2 cores).
    eager, _ = _losses(repo_root, demo_data, tmp_path / 'eager')
    compiled, out = _losses(repo_root, demo_data, tmp_path / 'compiled',
                            ['compile.backend=aot_eager'])
    assert 'compile: torch.compile' in out
    assert 'forward of backbone, neck, decode_head, auxiliary_head' in out
    assert len(eager) == 2
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
