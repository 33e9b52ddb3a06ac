"""Clear errors for pretrained weights that do not fit a ViT backbone."""
import re
from collections import defaultdict
from typing import Collection, Iterable, List, Mapping

from torch import nn

_LAYER = re.compile(r'^layers\.(\d+)\.')


def _depth(keys) -> int:
    """Number of transformer layers named in ``keys`` (``layers.<i>.*``)."""
    found = [int(m.group(1)) for m in map(_LAYER.match, keys) if m]
    return max(found) + 1 if found else 0


def describe_keys(keys: Iterable[str]) -> str:
    """Keys written compactly and exactly, the layers of each key gathered:
    ``layers.{0,1,2}.attn.dwc.weight, cls_token``."""
    layers, others = defaultdict(list), []
    for key in keys:
        match = _LAYER.match(key)
        if match:
            layers[key[match.end():]].append(int(match.group(1)))
        else:
            others.append(key)
    parts = [f'layers.{{{",".join(map(str, sorted(idx)))}}}.{rest}'
             if len(idx) > 1 else f'layers.{idx[0]}.{rest}'
             for rest, idx in layers.items()]
    return ', '.join(parts + others)


def check_state_dict_fits(model: nn.Module, state_dict: Mapping,
                          source: str,
                          optional: Collection[str] = ()) -> List[str]:
    """Raise ``ValueError`` unless ``state_dict`` can initialise ``model``.

    Checked in this order: the number of transformer layers, then the shape
    of every tensor (the first mismatch is named with both shapes), then
    the model weights the checkpoint lacks, except the ``optional`` ones:
    those it lacks are returned (they keep their initial values). Extra
    keys (a classifier head, a final norm the backbone does not use) are
    allowed.
    """
    own = model.state_dict()
    optional = set(optional)
    depth, own_depth = _depth(state_dict), _depth(own)
    if depth and depth != own_depth:
        raise ValueError(
            f'checkpoint {source} has {depth} transformer layers but the '
            f'backbone has num_layers={own_depth}: it was made for another '
            'model depth; use the config of that model or weights made for '
            'this one')
    for key, value in own.items():
        theirs = state_dict.get(key)
        if theirs is not None and tuple(theirs.shape) != tuple(value.shape):
            raise ValueError(
                f'checkpoint {source} does not fit the backbone: {key} has '
                f'shape {tuple(theirs.shape)} in the checkpoint but '
                f'{tuple(value.shape)} in the model; it was made for another '
                'width (embed_dims), patch size or number of channels; use '
                'the config of that model or weights made for this one')
    missing = [key for key in own
               if key not in state_dict and key not in optional]
    if missing:
        more = ', ...' if len(missing) > 10 else ''
        shown = ', '.join(missing[:10]) + more
        raise ValueError(
            f'checkpoint {source} lacks {len(missing)} of the backbone\'s '
            f'{len(own)} weights: {shown}. Convert it to mmseg\'s ViT keys '
            'first (checkpoint keys must match the backbone state dict)')
    return [key for key in own if key in optional and key not in state_dict]
