"""Whole mmseg segmentors for the subcommands ``segmentor`` and
``scaling``: configs, models with random weights, the measured steps.

Needs mmseg (imported by the subcommands that use it, never by ``--help``).
A MiTA config is compared with its full-attention twins
(:func:`attention_variants`): ``sdpa``, the same config with
``mita_cfg=None, full_attention='sdpa'`` (the same ``MiTAViT`` computing
full attention with ``F.scaled_dot_product_attention``), and ``mmseg``,
that twin with mmseg's own ``VisionTransformer`` (mmcv's
``MultiheadAttention``, which builds the N x N weights). Models are built
with random weights (no checkpoint is read) and SyncBN turned into BN (one
process has no group to synchronise with).
"""
import copy
import os.path as osp
from typing import Callable, Dict, List, Optional, Sequence

import torch
from mmengine.config import Config

from mmseg_mita.tools import resolve_config


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """A config (a file, or a packaged config's name:
    :func:`mmseg_mita.config_path`), with ``cfg_options`` merged; loads the
    plugin."""
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    full = resolve_config(path)
    if not osp.isfile(full):
        raise FileNotFoundError(f'no config at {full}: give a config file '
                                "or a packaged config's name "
                                '(mmseg_mita.list_configs())')
    cfg = Config.fromfile(full)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def attention_variants(cfg: Config) -> Dict[str, Config]:
    """``{'mita', 'sdpa', 'mmseg'}`` configs from a MiTA config."""
    backbone = cfg.model.backbone
    if backbone.get('type') != 'MiTAViT' or backbone.get('mita_cfg',
                                                          {}) is None:
        raise ValueError(
            f'{cfg.filename} is not a MiTA model (backbone '
            f'{backbone.get("type")!r}, mita_cfg '
            f'{backbone.get("mita_cfg", "default")!r}); give a MiTA config')
    sdpa = copy.deepcopy(cfg)
    sdpa.model.backbone.update(mita_cfg=None, full_attention='sdpa')
    mmseg = copy.deepcopy(sdpa)
    mmseg.model.backbone.pop('mita_cfg', None)
    mmseg.model.backbone.pop('full_attention', None)
    mmseg.model.backbone.type = 'VisionTransformer'
    return dict(mita=cfg, sdpa=sdpa, mmseg=mmseg)


def build(cfg: Config, device: torch.device):
    """The segmentor of ``cfg`` with random weights, BN for SyncBN."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.init_cfg = None  # no pretrained weights
    return revert_sync_batchnorm(MODELS.build(model_cfg)).to(device)


def random_samples(images: torch.Tensor, num_classes: int,
                   seed: int) -> List[object]:
    """One ``SegDataSample`` per image: its shapes and random labels."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    b, _, h, w = images.shape
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(b):
        sample = SegDataSample(metainfo=dict(
            img_shape=(h, w), pad_shape=(h, w), ori_shape=(h, w),
            padding_size=[0, 0, 0, 0]))
        labels = torch.randint(0, num_classes, (1, h, w), generator=gen)
        sample.gt_sem_seg = PixelData(data=labels.to(images.device))
        samples.append(sample)
    return samples


def random_images(batch: int, size: Sequence[int], seed: int,
                  device: torch.device) -> torch.Tensor:
    """Normalised images (what the data preprocessor outputs)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, *size, generator=gen).to(device)


def inference_step(model, images: torch.Tensor,
                   predict: bool) -> Callable[[], object]:
    """``predict``: mmseg's ``predict`` (whole or sliding window as the
    model's ``test_cfg`` says, logits resized to the input, argmax);
    otherwise the logits of ``mode='tensor'`` (the decode head's output
    resolution). Under ``no_grad``, model in eval mode."""
    samples = random_samples(images, 1, 0) if predict else None
    model.eval()

    def step():
        with torch.no_grad():
            if predict:
                return model.predict(images, samples)
            return model(images, mode='tensor')

    return step


def training_step(model, images: torch.Tensor, seed: int,
                  optim_wrapper=None) -> Callable[[], object]:
    """Forward of the losses on random labels and backward; with
    ``optim_wrapper`` its update (step, zero_grad) as mmengine's
    ``train_step`` does, otherwise the gradients are reset to None."""
    samples = random_samples(images, model.decode_head.num_classes, seed)
    model.train()

    def step():
        losses = model(images, samples, mode='loss')
        loss, _ = model.parse_losses(losses)
        if optim_wrapper is not None:
            optim_wrapper.update_params(loss)
        else:
            loss.backward()
            model.zero_grad(set_to_none=True)

    return step
