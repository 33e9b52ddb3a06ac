"""Export a segmentor (MiTA or full attention) to ONNX and check it in ONNX
Runtime (``mmseg_mita.deploy.export_tool``: the options and checks).

    python tools/export_onnx.py CONFIG [CHECKPOINT] --shape H W
                                --out FILE.onnx [--dynamic]
                                [--check-shape H W] [--atol A]
                                [--min-agreement F] [--cfg-options ...]
"""
import sys

from mmseg_mita.deploy.export_tool import main

if __name__ == '__main__':
    sys.exit(main())
