"""Evaluate a checkpoint under MiTA for a grid of landmark grids and top-k,
and for the paper's variants (``mmseg_mita.analysis.sweep_mk``: what is
evaluated and written, the options).

    python tools/sweep_mk.py CONFIG CKPT --pool-sizes 3 5 7 9 \\
        --topks 9 25 49 81 [--experts-per-query 1 2] [--ablations] \\
        [--work-dir DIR] [--cfg-options ...]
"""
from mmseg_mita.analysis.sweep_mk import main

if __name__ == '__main__':
    main()
