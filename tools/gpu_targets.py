"""The targets of issue 20 from one ``tools/gpu_check.sh`` run.

    python tools/gpu_targets.py OUT_DIR [--json OUT_DIR/targets.json]

Reads the run's JSON and junit files (see ``mmseg_mita.benchmarks.targets``
for the rules), writes ``targets.json`` (every target: measured value or
null with the reason, target, baseline, met) and prints the table. Exit
code 0 whether or not the targets are met (they are results, not checks).
"""
import argparse
import os.path as osp

from mmseg_mita.benchmarks.targets import evaluate, format_targets
from mmseg_mita.utils import write_json


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir')
    parser.add_argument('--json', help='default: OUT_DIR/targets.json')
    args = parser.parse_args(argv)
    result = evaluate(args.out_dir)
    write_json(result, args.json or osp.join(args.out_dir, 'targets.json'))
    print(format_targets(result))
    return result


if __name__ == '__main__':
    main()
