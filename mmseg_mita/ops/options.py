"""The options of MiTA attention, validated once where they are built.

:class:`MiTAOptions` is what the operator, the per-query reference, the
FLOP analysis and the backbone pass around; the operator resolves it
against each call's inputs into a :class:`~.plan.MiTAPlan`, which the
backends get. Adding an option means adding a field here (with its check)
and to the plan, computing it in :func:`~.naive.naive_mita` and in the
backends that support it, and declaring which backends do (their
``BACKEND``, :class:`~.declaration.MiTABackend`).
"""
import dataclasses
from typing import Mapping, Optional, Tuple

from mmseg_mita.utils import (check_choice, check_flag, check_int,
                              check_int_pair)

LANDMARKS = ('patches', 'official')


@dataclasses.dataclass(frozen=True)
class MiTAOptions:
    """How MiTA computes (see :func:`~.mita_attention.mita_attention`).

    Attributes:
        pool_size: the landmark grid (ph, pw) (an int means (p, p));
            ``m = ph * pw`` landmarks.
        topk: keys per routed expert (``topk >= N`` means every key).
        experts_per_query: ``s``, the routed experts of each query, at most
            ``m``; its softmax covers ``m + s * k`` logits.
        shared_expert: ``False`` leaves out the ``m`` compressed keys
            (routing-only).
        routed_experts: ``False`` leaves out the routed keys
            (compression-only; ``experts_per_query`` must stay 1).
        landmarks: ``'patches'`` pools the patch queries; ``'official'``
            pools the first ``H * W`` tokens as the authors' code does
            (needs exactly one extra token).

    The fields are validated once, when the options are built;
    ``prefix`` (not a field) goes in front of each field's name in the
    error messages, e.g. ``'mita_cfg.'``.
    """
    pool_size: Tuple[int, int] = (7, 7)
    topk: int = 49
    experts_per_query: int = 1
    shared_expert: bool = True
    routed_experts: bool = True
    landmarks: str = 'patches'
    prefix: dataclasses.InitVar[str] = ''

    def __post_init__(self, prefix: str):
        object.__setattr__(self, 'pool_size', _checked(self, prefix))

    @classmethod
    def from_dict(cls, fields: Mapping,
                  prefix: str = '') -> 'MiTAOptions':
        """Options from a dict of fields (defaults for the missing ones);
        errors name each field with ``prefix`` in front, e.g.
        ``'mita_cfg.'``."""
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValueError(
                f'unknown MiTA option{"s" if len(unknown) > 1 else ""} '
                f'{", ".join(prefix + k for k in unknown)}; the options '
                f'are {", ".join(FIELDS)}')
        return cls(**fields, prefix=prefix)

    @property
    def num_landmarks(self) -> int:
        """``m``."""
        return self.pool_size[0] * self.pool_size[1]

    def fitted(self, hw: Tuple[int, int]) -> 'MiTAOptions':
        """These options for a patch grid ``hw`` smaller than the landmark
        grid: at most one landmark per patch along each axis (m shrinks),
        and at most m experts per query. Unchanged for a large enough
        grid (no copy: a layer calls this on every forward, also while
        ``torch.compile`` traces it, so it is kept free of caches)."""
        pool = tuple(min(p, int(s)) for p, s in zip(self.pool_size, hw))
        if pool == self.pool_size:
            return self
        return dataclasses.replace(
            self, pool_size=pool,
            experts_per_query=min(self.experts_per_query, pool[0] * pool[1]))


FIELDS = tuple(f.name for f in dataclasses.fields(MiTAOptions))
DEFAULTS = {f.name: f.default for f in dataclasses.fields(MiTAOptions)}


def _checked(options: MiTAOptions, prefix: str) -> Tuple[int, int]:
    """The fields of ``options`` checked together; returns ``pool_size`` as
    a pair. ``ValueError`` naming the field (with ``prefix``) and the fix
    otherwise."""
    pool = check_int_pair(options.pool_size, f'{prefix}pool_size')
    check_int(options.topk, f'{prefix}topk')
    s = check_int(options.experts_per_query, f'{prefix}experts_per_query')
    shared = check_flag(options.shared_expert, f'{prefix}shared_expert')
    routed = check_flag(options.routed_experts, f'{prefix}routed_experts')
    check_choice(options.landmarks, f'{prefix}landmarks', LANDMARKS)
    if not (shared or routed):
        raise ValueError(
            f'{prefix}shared_expert and {prefix}routed_experts cannot both '
            'be False: there would be no key to attend to; keep at least '
            'one (shared_expert=False is routing-only, routed_experts=False '
            'compression-only)')
    m = pool[0] * pool[1]
    if routed and s > m:
        raise ValueError(
            f'{prefix}experts_per_query={s} is more than the m={m} experts '
            f'(landmarks); use experts_per_query <= {m} or a larger '
            'pool_size')
    if not routed and s != 1:
        raise ValueError(
            f'{prefix}experts_per_query={s} has no effect with '
            f'{prefix}routed_experts=False (compression-only routes no '
            'query); leave it at 1')
    return pool


def as_options(options: Optional[MiTAOptions], fields: Mapping,
               name: str = 'options') -> MiTAOptions:
    """``options``, or options built from keyword ``fields`` (the
    convenience form ``pool_size=7, topk=49``), not both."""
    if options is None:
        return MiTAOptions.from_dict(fields)
    if not isinstance(options, MiTAOptions):
        raise ValueError(f'{name} must be a MiTAOptions, got {options!r}; '
                         'build one with MiTAOptions(pool_size=..., '
                         'topk=...)')
    if fields:
        raise ValueError(
            f'pass either {name} or the option keywords '
            f'{sorted(fields)}, not both: use '
            f'dataclasses.replace({name}, ...) to change a field')
    return options
