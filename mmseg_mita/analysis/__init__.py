"""FLOP counting with attention included (see ``tools/get_flops.py``);
the modules of ``tools/show_experts.py`` (what the routed experts select)
and ``tools/sweep_mk.py`` (mIoU over landmark grids and top-k)."""
from .complexity import (attention_flops, flop_analyzer, mita_as_one_op,
                         segmentor_complexity)
from .flop_handles import (ATTENTION_OPS, FLOP_HANDLES, MITA_OP,
                           mita_op_flops)

__all__ = [
    'ATTENTION_OPS', 'FLOP_HANDLES', 'MITA_OP', 'attention_flops',
    'flop_analyzer', 'mita_as_one_op', 'mita_op_flops',
    'segmentor_complexity'
]
