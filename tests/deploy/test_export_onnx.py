"""Whole segmentors exported to ONNX reproduce PyTorch in ONNX Runtime."""
import os.path as osp

import numpy as np
import pytest
import torch

MISSING = 'the deploy extra is not installed: pip install -e .[deploy]'
pytest.importorskip('onnx', reason=MISSING)
pytest.importorskip('onnxruntime', reason=MISSING)
import onnx  # noqa: E402

from mmseg_mita.deploy import (build_segmentor, compare_logits,  # noqa
                               export_onnx, prepare_for_export,
                               run_onnxruntime, torch_logits,
                               within_tolerance)
from mmseg_mita.models import CBTHead  # noqa: E402
from mmseg_mita.ops import mita_attention  # noqa: E402
from mmseg_mita.ops.fixed_pooling import FixedAdaptiveAvgPool2d  # noqa: E402
from helpers import ROOT  # noqa: E402

DEMO = 'configs/mita_vit/mita-vit-mini8_upernet_1xb8-1k_demo-96x96.py'
DEMO_FULL = 'configs/mita_vit/vit-mini8_upernet_1xb8-1k_demo-96x96.py'
CBT = 'configs/mita_vit/mita-vit-s16_cbt_8xb1-160k_ade20k-512x512.py'
CBT_FULL = 'configs/mita_vit/vit-s16_cbt_8xb1-160k_ade20k-512x512.py'


def _export(config, shape, path, dynamic=False, check_shapes=(),
            cfg_options=None):
    """Export ``config`` (random weights) at ``shape``; returns the eager
    PyTorch logits (before the export switches) and ONNX Runtime's, at
    ``shape`` and each of ``check_shapes``."""
    torch.manual_seed(0)
    model = build_segmentor(osp.join(ROOT, config), cfg_options=cfg_options)
    gen = torch.Generator().manual_seed(0)
    inputs = [
        torch.randn(1, 3, *s, generator=gen)
        for s in (shape, ) + tuple(check_shapes)
    ]
    references = torch_logits(model, inputs)
    prepare_for_export(model, dynamic=dynamic)
    export_onnx(model, shape, str(path), dynamic=dynamic)
    return [(ref, run_onnxruntime(str(path), x.numpy()))
            for x, ref in zip(inputs, references)]


class _GridAttention(torch.nn.Module):
    """MiTA over a cls token plus an H x W grid of tokens [B, heads, H, W,
    d]: H and W reach the operator as traced sizes under export."""

    def __init__(self, backend, landmarks='patches'):
        super().__init__()
        self.backend = backend
        self.landmarks = landmarks

    def forward(self, grid):
        b, heads, h, w, d = grid.shape
        x = grid.reshape(b, heads, h * w, d)
        x = torch.cat([x.mean(2, keepdim=True), x], dim=2)
        out = mita_attention(x, x.flip(-1), x * 2 - 1, (h, w), pool_size=3,
                             topk=20, landmarks=self.landmarks,
                             backend=self.backend)
        return out[:, :, 1:].reshape(b, heads, h, w, d)


@pytest.mark.parametrize('landmarks', ['patches', 'official'])
def test_mita_operator_exports_with_dynamic_grid(tmp_path, landmarks):
    # topk = 20 >= N = 1 + 3 * 4 at the smaller grid: TopK's k follows N
    path = str(tmp_path / 'mita_op.onnx')
    gen = torch.Generator().manual_seed(0)
    grids = [torch.randn(2, 3, *hw, 8, generator=gen)
             for hw in ((7, 9), (3, 4), (10, 6))]
    with torch.no_grad():
        torch.onnx.export(_GridAttention('export', landmarks), (grids[0], ),
                          path, dynamo=False, opset_version=17,
                          input_names=['grid'],
                          dynamic_axes={'grid': {2: 'h', 3: 'w'}})
        import onnxruntime as ort
        session = ort.InferenceSession(path,
                                       providers=['CPUExecutionProvider'])
        for grid in grids:
            got = session.run(None, {'grid': grid.numpy()})[0]
            ref = _GridAttention('torch', landmarks)(grid).numpy()
            np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def _assert_same(ref, got, num_classes):
    assert got.shape == ref.shape and ref.shape[1] == num_classes
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
    assert (got.argmax(1) == ref.argmax(1)).all()


def _node_types(path):
    return {node.op_type for node in onnx.load(str(path)).graph.node}


@pytest.fixture(scope='module')
def demo_exports(tmp_path_factory):
    """The demo config, MiTA and its full-attention twin, exported at
    96 x 96: {config: (path, [(PyTorch logits, ONNX Runtime logits)])}."""
    folder = tmp_path_factory.mktemp('demo_onnx')
    exports = {}
    for config in (DEMO, DEMO_FULL):
        path = folder / (osp.basename(config) + '.onnx')
        exports[config] = (path, _export(config, (96, 96), path))
    return exports


@pytest.mark.parametrize('config', [DEMO, DEMO_FULL])
def test_demo_upernet_matches_pytorch(config, demo_exports):
    path, [(ref, got)] = demo_exports[config]
    _assert_same(ref, got, num_classes=5)
    ops = _node_types(path)
    if config == DEMO:
        assert {'TopK', 'Gather', 'MatMul', 'Softmax'} <= ops
    # UPerNet's pyramid pooling as matrices, not a size-bound AveragePool
    assert not ops & {'AveragePool', 'GlobalAveragePool'}


def test_dynamic_export_runs_at_other_sizes(tmp_path):
    # 96 x 96 -> a 12 x 12 grid (4 x 4 landmarks divide it); 104 x 136 ->
    # 13 x 17, which they do not; 100 x 90 is no multiple of the patch
    # size 8 (padded to 104 x 96 inside the graph).
    results = _export(DEMO, (96, 96), tmp_path / 'dyn.onnx', dynamic=True,
                      check_shapes=[(104, 136), (100, 90)])
    for ref, got in results:
        _assert_same(ref, got, num_classes=5)


def test_dynamic_export_of_a_non_square_backbone(tmp_path):
    # img_size 64 x 96: a 8 x 12 grid of position embeddings, resized in the
    # graph to 8 x 12 (the export size), 10 x 7 and 13 x 17 (two inputs, one
    # no multiple of the patch size); an embedding grid taken as (W, H)
    # would be laid out wrongly at every size.
    results = _export(DEMO_FULL, (64, 96), tmp_path / 'wide.onnx',
                      dynamic=True, check_shapes=[(80, 56), (100, 136)],
                      cfg_options={'model.backbone.img_size': (64, 96)})
    for ref, got in results:
        _assert_same(ref, got, num_classes=5)


@pytest.mark.parametrize('config', [CBT, CBT_FULL])
def test_vit_s_cbt_non_square_matches_pytorch(config, tmp_path):
    # 112 x 144 -> a 7 x 9 token grid: MiTA's 7 x 7 landmarks and CBT's
    # 10 x 10 representatives do not divide it.
    (ref, got), = _export(config, (112, 144), tmp_path / 'cbt.onnx')
    _assert_same(ref, got, num_classes=150)


def _tensors_with_square_token_dims(path, num_tokens):
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    found = []
    for value in model.graph.value_info:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if dims.count(num_tokens) >= 2:
            found.append((value.name, dims))
    return found


def test_mita_export_has_no_token_by_token_tensor(demo_exports):
    # demo at 96 x 96: N = 1 + 12 * 12 = 145 tokens. Full attention has
    # [.., N, N] scores; MiTA's largest tensors are [G * N, k, d].
    assert _tensors_with_square_token_dims(demo_exports[DEMO_FULL][0], 145)
    assert _tensors_with_square_token_dims(demo_exports[DEMO][0], 145) == []


@pytest.mark.parametrize('hw', [(5, 7), (4, 6), (10, 10)])
def test_prepared_cbt_head_keeps_its_outputs(hw):
    # CBT's 10 x 10 representatives from grids they do not divide (or
    # exceed): the exportable pooling gives the eager head's logits.
    torch.manual_seed(0)
    head = CBTHead(in_channels=24, num_classes=5, num_heads=2, head_dims=8,
                   pool_size=10).double().eval()
    head.init_weights()
    feats = torch.randn(2, 24, *hw, dtype=torch.float64)
    with torch.no_grad():
        eager = head([feats])
        prepare_for_export(head)
        assert all(
            type(layer.attn.pool) is FixedAdaptiveAvgPool2d
            for layer in head.layers)
        torch.testing.assert_close(head([feats]), eager, rtol=1e-12,
                                   atol=1e-12)


def test_export_from_checkpoint(tmp_path):
    torch.manual_seed(1)
    model = build_segmentor(osp.join(ROOT, DEMO))
    checkpoint = tmp_path / 'demo.pth'
    torch.save(dict(state_dict=model.state_dict()), checkpoint)
    torch.manual_seed(2)
    loaded = build_segmentor(osp.join(ROOT, DEMO), str(checkpoint))
    for (name, a), b in zip(model.state_dict().items(),
                            loaded.state_dict().values()):
        assert torch.equal(a, b), name
    # loading is strict: a checkpoint without one weight is refused
    weights = model.state_dict()
    weights.pop('decode_head.conv_seg.weight')
    torch.save(dict(state_dict=weights), checkpoint)
    with pytest.raises(RuntimeError, match='conv_seg.weight'):
        build_segmentor(osp.join(ROOT, DEMO), str(checkpoint))


def test_tool_reports_and_fails_above_tolerance(tmp_path, capsys):
    from mmseg_mita.deploy.export_tool import main
    out = tmp_path / 'demo.onnx'
    args = [osp.join(ROOT, DEMO), '--shape', '96', '96', '--out', str(out)]
    assert main(args + ['--dynamic', '--check-shape', '104', '136']) == 0
    log = capsys.readouterr().out
    assert out.is_file() and 'dynamic' in log
    for size in ('96 x 96', '104 x 136'):
        assert f'{size}: max |logits - PyTorch| =' in log
    assert log.count(': ok') == 2
    # a tolerance no float32 export meets: exit status 1
    assert main(args + ['--atol', '0']) == 1
    assert 'FAILED' in capsys.readouterr().out


def _crafted_logits():
    """Random logits [2, 4, 5, 6]: with 4 classes, reversing the class axis
    changes the argmax of every pixel (no class is its own mirror)."""
    return np.random.default_rng(0).standard_normal(
        (2, 4, 5, 6)).astype(np.float32)


def test_compare_logits_counts_pixels_of_the_same_class():
    ref = _crafted_logits()
    same = compare_logits(ref, ref + np.float32(1e-3))
    assert same['agreement'] == 1.0
    assert same['max_abs_diff'] == pytest.approx(1e-3, rel=1e-3)
    assert within_tolerance(same, atol=1e-2, min_agreement=1.0)
    assert not within_tolerance(same, atol=1e-4, min_agreement=0.0)

    # every class swapped: small logits, no pixel of the same class
    swapped = compare_logits(ref, ref[:, ::-1])
    assert swapped['agreement'] == 0.0
    assert not within_tolerance(swapped, atol=np.inf, min_agreement=0.98)

    # classes swapped in columns 0 and 3 of 6 only: 2 / 3 agree
    partial = ref.copy()
    partial[..., [0, 3]] = ref[:, ::-1][..., [0, 3]]
    result = compare_logits(ref, partial)
    assert result['agreement'] == pytest.approx(2 / 3)
    assert within_tolerance(result, atol=np.inf, min_agreement=2 / 3)
    assert not within_tolerance(result, atol=np.inf, min_agreement=0.7)

    with pytest.raises(ValueError, match='do not match the reference'):
        compare_logits(ref, ref[:, :3])


def test_tool_fails_on_swapped_classes(tmp_path, capsys, monkeypatch):
    # ONNX Runtime's logits replaced by the same logits with the class axis
    # rolled by one (every pixel's class changes): any --atol passes them,
    # the class agreement must not.
    from mmseg_mita.deploy import export_tool
    run = export_tool.run_onnxruntime
    monkeypatch.setattr(export_tool, 'run_onnxruntime',
                        lambda *args: np.roll(run(*args), 1, axis=1))
    out = tmp_path / 'demo.onnx'
    assert export_tool.main([osp.join(ROOT, DEMO_FULL), '--shape', '32',
                             '32', '--out', str(out), '--atol', '1e9']) == 1
    log = capsys.readouterr().out
    assert 'FAILED' in log and 'same class on 0.000% of pixels' in log
