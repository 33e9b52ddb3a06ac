"""Draw which keys MiTA's routed experts select, layer by layer.

    python tools/show_experts.py CONFIG CKPT IMAGE --out DIR \\
        [--pool-size P --topk K] [--cfg-options ...]

For every MiTA layer, ``DIR/layer{i}.png`` shows the input image as the
network sees it (after the test pipeline) with, per head and averaged over
heads, how often each key position is selected: the fraction of all queries
whose routed expert gathered that key, i.e. ``sum_j (n_j / N) [t in T_j]``
with ``n_j`` queries routed to expert ``j``. White lines mark the landmark
grid (the adaptive-pooling cells whose mean query is a landmark).
``DIR/all_layers.png`` puts the head averages of all layers side by side.

A full-attention checkpoint (mmseg's ``VisionTransformer``) is shown as MiTA
would route it with ``--pool-size``/``--topk``; these also override the
setting of a MiTA config.
"""
import argparse
import os
import os.path as osp

import torch
import torch.nn.functional as F
from mmengine.config import Config, DictAction

from mmseg_mita.utils import write_atomic


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0].replace('\n', ' '))
    parser.add_argument('config')
    parser.add_argument('checkpoint')
    parser.add_argument('image')
    parser.add_argument('--out', required=True, help='output folder')
    parser.add_argument('--pool-size', type=int, help='landmark grid p')
    parser.add_argument('--topk', type=int, help='routed keys k')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


def selection_frequency(expert, topk_index, num_experts):
    """How often each key is gathered by the routed expert of a query.

    Args:
        expert: [G, N] expert of every query, or [G, N, s] its ``s``
            experts; topk_index: [G, m, k].
    Returns:
        [G, N]: for key t, the number of times an average query gathers t
        (with one expert per query: the fraction of the N queries whose
        expert's top-k contains t).
    """
    g, n = expert.shape[:2]
    expert = expert.reshape(g, -1)
    counts = torch.zeros(g, num_experts, dtype=torch.float64)
    counts.scatter_add_(1, expert,
                        torch.ones(expert.shape, dtype=torch.float64))
    selected = torch.zeros(g, num_experts, n, dtype=torch.float64)
    selected.scatter_(2, topk_index, 1.0)
    return (counts[:, :, None] * selected).sum(1) / n


def pooling_cells(size, bins):
    """Start/end of each adaptive-average-pooling cell along one axis."""
    return [(i * size // bins, -(-(i + 1) * size // bins))
            for i in range(bins)]


class ExpertRecorder:
    """Records the routing of every MiTA layer of a ``MiTAViT`` forward."""

    def __init__(self, backbone):
        from mmseg_mita.ops import MiTAPlan, compute_experts
        self.compute_experts = compute_experts
        self.plan = MiTAPlan.build
        self.backbone = backbone
        self.maps = {}  # layer index -> [heads, N] selection frequency
        self.inputs = None
        backbone.register_forward_pre_hook(self._record_input)
        for i, layer in enumerate(backbone.layers):
            layer.attn.register_forward_pre_hook(self._hook(i),
                                                 with_kwargs=True)

    def _record_input(self, module, args):
        self.inputs = args[0].detach()

    def _hook(self, index):

        def hook(attn, args, kwargs):
            if attn.mita is None:
                return
            x = args[0] if attn.batch_first else args[0].transpose(0, 1)
            b, n, c = x.shape
            qkv = F.linear(x, attn.attn.in_proj_weight,
                           attn.attn.in_proj_bias)
            q, k, v = qkv.view(b, n, 3, attn.num_heads,
                               c // attn.num_heads).permute(2, 0, 3, 1, 4)
            # the options the layer uses (fewer landmarks on a small grid)
            hw = tuple(kwargs['hw_shape'])
            options = attn.mita.options.fitted(hw)
            if not options.routed_experts:
                raise SystemExit('error: compression-only MiTA '
                                 '(routed_experts=False) selects no keys')
            plan = self.plan(q, hw, attn.num_extra_tokens, options)
            experts = self.compute_experts(q, k, v, plan)
            freq = selection_frequency(experts.expert, experts.topk_index,
                                       options.num_landmarks)
            self.maps[index] = dict(
                freq=freq.view(b, attn.num_heads, n)[0], hw=hw,
                pool=options.pool_size, extra=attn.num_extra_tokens,
                topk=options.topk)

        return hook


def build_model(args):
    from mmseg.apis import init_model
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    backbone = cfg.model.backbone
    if backbone.get('type') not in ('VisionTransformer', 'MiTAViT'):
        raise SystemExit('error: the backbone must be VisionTransformer or '
                         f'MiTAViT, got {backbone.get("type")!r}')
    if backbone.get('type') == 'VisionTransformer':
        backbone.type = 'MiTAViT'  # full attention unless --cfg-options say
        mita = backbone.get('mita_cfg')
    else:
        mita = backbone.get('mita_cfg', {})  # absent: MiTAViT's defaults
    override = {k: v for k, v in (('pool_size', args.pool_size),
                                  ('topk', args.topk)) if v is not None}
    if mita is None and not override:
        raise SystemExit('error: this model uses full attention; pass '
                         '--pool-size and --topk to see what MiTA would '
                         'select')
    backbone.mita_cfg = dict(mita or {}, **override)
    return init_model(cfg, args.checkpoint, device='cpu')


def input_image(inputs, preprocessor):
    """The backbone input [1, 3, H, W] as an RGB uint8 image [H, W, 3]."""
    mean = preprocessor.mean.view(3, 1, 1)
    std = preprocessor.std.view(3, 1, 1)
    image = (inputs[0] * std + mean).clamp(0, 255).byte()
    image = image.permute(1, 2, 0).numpy()
    return image if preprocessor.channel_conversion else image[..., ::-1]


def draw_panel(ax, image, record, freq, title, vmax):
    h, w = record['hw']
    ph, pw = image.shape[0] / h, image.shape[1] / w
    extra = record['extra']
    grid = freq[extra:].reshape(h, w).numpy()
    ax.imshow(image)
    shown = ax.imshow(grid, cmap='magma', alpha=0.6, vmin=0, vmax=vmax,
                      extent=(0, image.shape[1], image.shape[0], 0),
                      interpolation='nearest')
    for axis, (size, step) in enumerate(((h, ph), (w, pw))):
        for start, end in pooling_cells(size, record['pool'][axis]):
            for edge in (start, end):
                if axis == 0:
                    ax.axhline(edge * step, color='w', lw=0.6)
                else:
                    ax.axvline(edge * step, color='w', lw=0.6)
    cls = f', cls {100 * freq[:extra].max():.0f}%' if extra else ''
    ax.set_title(title + cls, fontsize=8)
    ax.set_axis_off()
    return shown


def render(image, maps, out):
    """Write layer{i}.png per MiTA layer and all_layers.png."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    os.makedirs(out, exist_ok=True)
    written = []
    for index, record in sorted(maps.items()):
        freq = record['freq']
        panels = [('mean of heads', freq.mean(0))] + [
            (f'head {h}', freq[h]) for h in range(freq.shape[0])]
        fig, axes = plt.subplots(1, len(panels),
                                 figsize=(2.4 * len(panels) + 0.8, 2.8),
                                 squeeze=False, layout='constrained')
        vmax = float(freq[:, record['extra']:].max())
        for ax, (name, values) in zip(axes[0], panels):
            shown = draw_panel(ax, image, record, values, name, vmax)
        fig.colorbar(shown, ax=axes[0].tolist(), shrink=0.8,
                     label='share of queries')
        p, k = record['pool'], record['topk']
        fig.suptitle(f'layer {index}: keys gathered by routed experts '
                     f'(m={p[0]}x{p[1]}, k={k})', fontsize=9)
        path = osp.join(out, f'layer{index}.png')
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
        plt.close(fig)
        written.append(path)
    fig, axes = plt.subplots(1, len(maps),
                             figsize=(2.4 * len(maps) + 0.8, 2.8),
                             squeeze=False, layout='constrained')
    for ax, (index, record) in zip(axes[0], sorted(maps.items())):
        mean = record['freq'].mean(0)
        shown = draw_panel(ax, image, record, mean, f'layer {index}',
                           float(mean[record['extra']:].max()))
        fig.colorbar(shown, ax=ax, shrink=0.7)
    fig.suptitle('keys gathered by routed experts (share of queries, mean '
                 'of heads); white: landmark cells', fontsize=9)
    path = osp.join(out, 'all_layers.png')
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format='png'))
    plt.close(fig)
    return written + [path]


def main(argv=None):
    args = parse_args(argv)
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    from mmseg.apis import inference_model
    if not osp.isfile(args.image):
        raise SystemExit(f'error: no image at {args.image}')
    model = build_model(args)
    recorder = ExpertRecorder(model.backbone)
    inference_model(model, args.image)
    if not recorder.maps:
        raise SystemExit('error: no layer used MiTA (mita_cfg.layers)')
    image = input_image(recorder.inputs, model.data_preprocessor)
    for path in render(image, recorder.maps, args.out):
        print(f'wrote {path}')
