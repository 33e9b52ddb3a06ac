"""Write the procedural demo dataset (``mmseg_mita.datasets.demo_data``)
in ADE20K's folder layout.

    python tools/make_demo_data.py data/demo_ade [--train 240 --val 48]
"""
from mmseg_mita.datasets.demo_data import main

if __name__ == '__main__':
    main()
