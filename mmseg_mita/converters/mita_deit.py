"""The authors' MiTA-DeiT checkpoints: timm keys plus, in every block, the
depth-wise value convolution and the output gate of their attention.

Their training code (DeiT's) saves ``{'model': timm state dict, 'args':
argparse.Namespace, ...}`` in three layouts, told apart by content:

* plain: exactly a timm ViT's keys (MiTA adds no parameters, so these
  weights look like a full-attention DeiT's);
* DWC: plus ``blocks.{i}.attn.dwc.weight`` [C, 1, 3, 3] and ``.bias`` [C];
* DWC + gate: plus the DWC, and ``blocks.{i}.attn.qkvg.weight`` [4C, C] /
  ``.bias`` [4C] (chunks q, k, v, g) instead of ``attn.qkv``.

:func:`split_value_branch` turns them into a plain timm state dict (``qkv``
= the first 3C rows of ``qkvg``) plus the mmseg-named weights that
``MiTAViT(dwc=True, gate=True)`` adds: ``layers.{i}.attn.dwc.*`` and
``layers.{i}.attn.gate_proj.*`` (the last C rows of ``qkvg``).
"""
from argparse import Namespace
from typing import Any, Dict, List, NamedTuple

from torch import Tensor

from .timm_vit import BLOCK_RE

GATE_FINGERPRINT = 'blocks.0.attn.qkvg.weight'
DWC_KEYS = ('attn.dwc.weight', 'attn.dwc.bias')
QKVG_KEYS = ('attn.qkvg.weight', 'attn.qkvg.bias')
# per layer, mmseg names (MiTAViT with dwc / gate)
VALUE_BRANCH_KEYS = DWC_KEYS + ('attn.gate_proj.weight',
                                'attn.gate_proj.bias')
# training arguments worth showing (DeiT's names, or MiTA-looking ones)
ARG_NAMES = ('model', 'input_size')
ARG_WORDS = ('mita', 'pool', 'topk', 'landmark', 'expert', 'dwc', 'gate')


class ValueBranch(NamedTuple):
    """A timm state dict without the authors' additions, and those
    additions under mmseg keys."""
    timm_state_dict: Dict[str, Tensor]
    extra: Dict[str, Tensor]
    dwc: bool
    gate: bool
    notes: List[str]


def _check_every_block(name: str, found: set, blocks: set) -> None:
    if found and found != blocks:
        raise ValueError(
            f'{name} weights are in blocks {sorted(found)} but not in '
            f'{sorted(blocks - found)}: MiTAViT (like the authors\' code) '
            'has them in every layer or in none')


def _split_qkvg(key: str, value: Tensor, i: int, kind: str,
                timm_sd: Dict[str, Tensor], extra: Dict[str, Tensor]):
    rows = value.shape[0]
    if rows % 4:
        raise ValueError(f'{key} has {rows} rows: a fused q, k, v, gate '
                         'projection has 4 x embed_dims')
    if f'blocks.{i}.attn.qkv.{kind}' in timm_sd:
        raise ValueError(f'block {i} has both attn.qkv and attn.qkvg '
                         'weights; a checkpoint holds one of them')
    timm_sd[f'blocks.{i}.attn.qkv.{kind}'] = value[:rows // 4 * 3]
    extra[f'layers.{i}.attn.gate_proj.{kind}'] = value[rows // 4 * 3:]


def split_value_branch(sd: Dict[str, Tensor]) -> ValueBranch:
    """Separate the DWC and gate weights of a timm-named state dict."""
    timm_sd, extra, notes = {}, {}, []
    blocks, dwc_blocks, gate_blocks = set(), set(), set()
    for key, value in sd.items():
        block = BLOCK_RE.fullmatch(key)
        rest = block.group(2) if block else None
        if block:
            blocks.add(int(block.group(1)))
        if rest in DWC_KEYS:
            dwc_blocks.add(int(block.group(1)))
            extra[f'layers.{block.group(1)}.{rest}'] = value
        elif rest in QKVG_KEYS:
            gate_blocks.add(int(block.group(1)))
            _split_qkvg(key, value, int(block.group(1)),
                        rest.split('.')[-1], timm_sd, extra)
        else:
            if rest in ('attn.qkv.weight', 'attn.qkv.bias') and \
                    f'blocks.{block.group(1)}.attn.qkvg.weight' in sd:
                raise ValueError(f'block {block.group(1)} has both attn.qkv '
                                 'and attn.qkvg weights; a checkpoint holds '
                                 'one of them')
            timm_sd[key] = value
    _check_every_block('depth-wise value conv (attn.dwc)', dwc_blocks,
                       blocks)
    _check_every_block('gate (attn.qkvg)', gate_blocks, blocks)
    filled = []
    for key in [k for k in extra if k.endswith('.weight')]:
        bias = key[:-len('weight')] + 'bias'
        if bias not in extra:  # exact: a zero bias adds nothing
            extra[bias] = extra[key].new_zeros(extra[key].shape[0])
            filled.append(bias)
    if filled:
        notes.append(f'zero biases added where the source has none: '
                     f'{sorted({k.split(".", 2)[2] for k in filled})}')
    if dwc_blocks:
        notes.append('depth-wise value conv (blocks.*.attn.dwc) -> '
                     'layers.*.attn.dwc: the authors\' DWC variant')
    if gate_blocks:
        notes.append('fused q, k, v, gate projection (blocks.*.attn.qkvg) '
                     'split: q, k, v -> layers.*.attn.attn.in_proj_*, gate '
                     '-> layers.*.attn.gate_proj: the authors\' gate variant')
    return ValueBranch(timm_sd, extra, bool(dwc_blocks), bool(gate_blocks),
                       notes)


def training_args_note(obj: Any) -> List[str]:
    """The DeiT ``args`` saved in the checkpoint that say something about
    the model: its name, input size, and arguments whose names look like
    MiTA settings (a guess on names: the authors' arguments are not
    known here)."""
    args = obj.get('args') if isinstance(obj, dict) else None
    if not isinstance(args, Namespace):
        return []
    shown = {name: value for name, value in sorted(vars(args).items())
             if name in ARG_NAMES
             or any(word in name.lower() for word in ARG_WORDS)}
    if not shown:
        return []
    notes = ['training arguments saved in the checkpoint: ' + ', '.join(
        f'{name}={value!r}' for name, value in shown.items())]
    side = shown.get('kv_topk')
    if isinstance(side, int) and not isinstance(side, bool):
        notes.append(
            f'kv_topk={side} is a side length: the authors\' code keeps '
            f'kv_topk ** 2 = {side * side} keys per expert; use '
            f'mita_cfg.topk={side * side} (not {side})')
    return notes


def mita_settings_notes(fmt: str, dwc: bool, gate: bool) -> List[str]:
    """What the weights tell, and do not tell, about the MiTA settings."""
    if dwc or gate:
        landmarks = (
            "landmarks: 'official'. dwc/gate weights come from the authors' "
            'MiTA-DeiT code, which pools the landmarks from the first H x W '
            "tokens (q[:, :-1]: the cls token and every patch but the last):"
            " set mita_cfg.landmarks='official' to run them as trained")
    elif fmt in ('timm', 'deit'):
        landmarks = (
            'landmarks: unknown. These are a plain ViT\'s keys: the authors\' '
            'plain MiTA-DeiT weights and a full-attention DeiT look the '
            "same. For the authors' MiTA-DeiT set mita_cfg.landmarks="
            "'official' (their code pools q[:, :-1]); for full-attention "
            "weights any landmarks fit (default 'patches')")
    elif fmt == 'mmseg':
        landmarks = ('landmarks: keep the mita_cfg of the config the '
                     'checkpoint was trained with')
    else:
        landmarks = ('landmarks: full-attention weights, any landmarks fit '
                     "(default 'patches')")
    if dwc or gate:
        sizes = (
            'pool_size, topk: the authors\' DWC and DWC + gate modules '
            'hard-code a 5 x 5 landmark grid and 25 keys per expert: '
            'mita_cfg.pool_size=5, mita_cfg.topk=25 run them as trained (the '
            'configs fine-tune with the paper\'s m = k = 49); layers: all')
    else:
        sizes = ('pool_size, topk, layers: not stored in weights (MiTA adds '
                 'no parameters); use those the model was trained with, or '
                 'those to fine-tune with')
    return [landmarks, sizes]
