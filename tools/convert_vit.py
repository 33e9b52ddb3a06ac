"""Convert a ViT checkpoint (full attention, or the authors' MiTA-DeiT) for
mmseg's VisionTransformer and MiTAViT (``mmseg_mita.converters.convert_tool``:
the formats, options and what it prints).

    python tools/convert_vit.py SRC DST [--format auto] [--num-heads N]
                                [--force]
"""
from mmseg_mita.converters.convert_tool import main

if __name__ == '__main__':
    main()
