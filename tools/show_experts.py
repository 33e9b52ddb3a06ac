"""Draw which keys MiTA's routed experts select, layer by layer
(``mmseg_mita.analysis.show_experts``: what is drawn and the options).

    python tools/show_experts.py CONFIG CKPT IMAGE --out DIR \\
        [--pool-size P --topk K] [--cfg-options ...]
"""
from mmseg_mita.analysis.show_experts import main

if __name__ == '__main__':
    main()
