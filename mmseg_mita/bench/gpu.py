"""The GPU suite: CUDA op tests, the op, encoder and 1-D benchmarks, targets.

Runs on one CUDA GPU where only torch, triton, numpy and pytest are
installed (no mmcv, mmengine, mmseg or flash-attn, no network), from a
plain copy of the repository; ``tools/gpu_check.sh OUT_DIR`` is this
command. The parts, in order, each in its own process under its own time
limit, the whole within ``--seconds`` (15 of them kept for the targets and
the summary); a part that fails or runs out of time is recorded and the
next one runs:

0. ``environment``: ``environment.json`` (machine, versions, CUDA, the
   operator's backends);
1. ``op_tests``: ``tests/ops/test_cuda_backends.py`` and
   ``tests/ops/test_flash_backend.py`` on CUDA (junit XML);
2. ``op_shapes``: subcommand ``op-shapes``, eager and CUDA graph;
3. ``encoder``: subcommand ``encoder``, eager;
4. ``attention``: subcommand ``op`` up to N = 262145 (if it fails, once
   more with the torch backend only: ``attention_torch_only``);
5. ``throughput_1d``: subcommand ``throughput-1d``, m = k = 49 and
   m k = N / 4;
6. ``graph_tests``: ``tests/ops/test_graph_capture.py``;
7. ``op_shapes_compile`` and 8. ``encoder_compiled``: the compiled modes
   (each starts no measurement once its ``--max-seconds`` are spent);

then ``targets.json`` (:mod:`.targets`) and its table. ``OUT_DIR`` gets
one ``NAME.out`` (stdout) and ``NAME.log`` (stderr) per part, their JSON
and junit files, ``summary.tsv`` (part, status, exit code, seconds) and
``summary.txt`` (what is printed at the end); ``--json`` and
``--markdown`` also get the targets. Exit status 0 only if every part
passed. ``--cpu-smoke`` runs the same parts on the CPU at tiny sizes
with the torch backend (the plumbing, without a GPU).
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time

import torch

from mmseg_mita.utils import write_json
from .record import machine, versions
from .report import write_text
from .targets import evaluate, format_targets

# the checkout the suite runs in (its tests and scripts)
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RESERVE_S = 15  # for targets.json and the summary
BENCH = [sys.executable, '-m', 'mmseg_mita.bench']
PYTEST = [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-v',
          '-rs']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('out_dir', help='folder of the results (created)')
    parser.add_argument('--seconds', type=int, default=470,
                        help='time limit of the whole suite')
    parser.add_argument('--cpu-smoke', action='store_true',
                        help='tiny sizes on the CPU, torch backend only')


def sizes(smoke: bool) -> dict:
    """The options of each part: the GPU's, or tiny ones on the CPU."""
    if smoke:
        return dict(
            device='cpu', dtype='float32', backends=['torch'],
            compile_backends=['torch'],
            attention=['--tokens', '17', '26', '--heads', '2', '--head-dim',
                       '16', '--pool-size', '2', '--topk', '3'],
            throughput=['--tokens', '256', '1024', '--dim', '32',
                        '--warmup-tokens', '64'],
            # torch.compile with dynamo's 'eager' backend: inductor on a
            # CPU would compile C++ for minutes
            op_shapes=['--shapes', '17:2', '26:1', '--head-dim', '16',
                       '--pool-size', '2', '--topk', '3',
                       '--compile-backend', 'eager', '--repeats', '2',
                       '--time-budget', '0.2', '--min-run-ms', '1'],
            encoder=['--settings', 'train:32x32:2', 'infer:32x64:1', '--dim',
                     '32', '--depth', '2', '--heads', '2', '--patch', '4',
                     '--pool-size', '2', '--topk', '3', '--compile-backend',
                     'eager', '--repeats', '1', '--time-budget', '0.2'])
    return dict(
        device='cuda', dtype='bfloat16', backends=['torch', 'triton'],
        compile_backends=['triton'],  # the backend a CUDA graph can hold
        attention=['--tokens', '1025', '1601', '4097', '16385', '65537',
                   '262145'],
        throughput=['--tokens', '65536', '262144', '1048576'],
        op_shapes=['--repeats', '10', '--time-budget', '2'],
        encoder=['--repeats', '5', '--time-budget', '3'])


class Suite:
    """Runs the parts under one deadline, writing ``summary.tsv``."""

    def __init__(self, out_dir: str, seconds: int, env: dict):
        self.out, self.env = out_dir, env
        self.deadline = time.monotonic() + seconds - RESERVE_S
        self.parts = []  # (name, status, exit code, seconds)
        self._write_summary()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def budget(self, limit: int, margin: int) -> str:
        """A part's own ``--max-seconds``: min(limit, time left) - margin,
        at least 1."""
        return str(max(1, int(min(limit, self.left())) - margin))

    def _write_summary(self) -> None:
        lines = ['part\tstatus\texit_code\tseconds']
        lines += ['\t'.join(str(v) for v in part) for part in self.parts]
        write_text(osp.join(self.out, 'summary.tsv'), '\n'.join(lines) + '\n')

    def _record(self, name, status, code, seconds) -> bool:
        self.parts.append((name, status, code, round(seconds)))
        self._write_summary()
        if status != 'pass':
            log = osp.join(self.out, f'{name}.log')
            if osp.isfile(log):
                with open(log) as f:
                    print(''.join(f.readlines()[-20:]), file=sys.stderr)
        return status == 'pass'

    def run(self, name: str, limit: int, command: list) -> bool:
        """``command`` with stdout in NAME.out and stderr in NAME.log,
        under min(limit, time left)."""
        limit = min(limit, int(self.left()))
        if limit < 5:
            return self._record(name, 'skipped (no time left)', '-', 0)
        print(f'== {name} (limit {limit}s): {" ".join(command)}',
              file=sys.stderr, flush=True)
        start = time.monotonic()
        with open(osp.join(self.out, f'{name}.out'), 'w') as out, \
                open(osp.join(self.out, f'{name}.log'), 'w') as log:
            try:
                code = subprocess.run(command, stdout=out, stderr=log,
                                      cwd=ROOT, env=self.env,
                                      timeout=limit).returncode
                status = 'pass' if code == 0 else 'fail'
            except subprocess.TimeoutExpired:
                code, status = 124, 'timeout'
        return self._record(name, status, code, time.monotonic() - start)

    def environment(self) -> bool:
        """``environment.json``: what the suite runs on."""
        from mmseg_mita.ops import backend_names
        start = time.monotonic()
        info = dict(machine=machine(), versions=versions(),
                    cuda=torch.version.cuda,
                    cuda_available=torch.cuda.is_available(),
                    backends=list(backend_names()))
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name,
                        capability=list(torch.cuda.get_device_capability(0)),
                        memory_gib=round(props.total_memory / 2**30, 1),
                        multiprocessors=props.multi_processor_count)
        write_json(info, osp.join(self.out, 'environment.json'))
        return self._record('environment', 'pass', 0,
                            time.monotonic() - start)


def run_parts(suite: Suite, s: dict) -> None:
    tag = f'{s["device"]}_{s["dtype"]}'
    common = ['--device', s['device'], '--dtype', s['dtype']]
    out = suite.out

    def json_at(name):
        return ['--json', osp.join(out, f'{name}_{tag}.json')]

    suite.environment()
    suite.run('op_tests', 180, PYTEST + [
        'tests/ops/test_cuda_backends.py', 'tests/ops/test_flash_backend.py',
        '--junitxml', osp.join(out, 'op_tests.xml')])
    # eager and CUDA-graph measurements first (cheap; their JSON written
    # as they go, so a part cut short keeps what it measured)
    suite.run('op_shapes', 90, BENCH + ['op-shapes'] + common + [
        '--backends', *s['backends'], '--modes', 'eager', 'cudagraph',
        *s['op_shapes'], *json_at('op_shapes')])
    suite.run('encoder', 100, BENCH + ['encoder'] + common + [
        '--backends', *s['backends'], '--modes', 'eager', *s['encoder'],
        *json_at('encoder')])
    attention = BENCH + ['op'] + common + [*s['attention'], '--repeats', '5',
                                           '--time-budget', '10']
    if not suite.run('attention', 170, attention + [
            '--backends', *s['backends'], *json_at('attention')]) and (
                s['backends'] != ['torch']):
        suite.run('attention_torch_only', 100, attention + [
            '--backends', 'torch', '--json',
            osp.join(out, f'attention_{tag}_torch_only.json')])
    suite.run('throughput_1d', 200, BENCH + ['throughput-1d'] + common + [
        '--mk', '49', 'quarter', '--backends', *s['backends'], '--repeats',
        '5', '--time-budget', '12', *s['throughput'],
        *json_at('throughput_1d')])
    suite.run('graph_tests', 90, PYTEST + [
        'tests/ops/test_graph_capture.py', '--junitxml',
        osp.join(out, 'graph_tests.xml')])
    # the compiled measurements cost a compile each: they start no
    # measurement once their --max-seconds are spent (a margin for one
    # compile before the part's limit)
    suite.run('op_shapes_compile', 120, BENCH + ['op-shapes'] + common + [
        '--backends', *s['backends'], '--modes', 'compiled', '--max-seconds',
        suite.budget(120, 40), *s['op_shapes'], *json_at('op_shapes_compile')])
    suite.run('encoder_compiled', 400, BENCH + ['encoder'] + common + [
        '--backends', *s['compile_backends'], '--modes', 'compiled',
        '--max-seconds', suite.budget(400, 90), *s['encoder'],
        *json_at('encoder_compiled')])


def summary(suite: Suite, seconds: float) -> str:
    """The parts' statuses, then the tables they printed (the tests:
    their outcome lines)."""
    rows = [('part', 'status', 'exit_code', 'seconds')] + suite.parts
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    lines = [f'gpu suite: {seconds:.0f} s, results in {suite.out}']
    lines += ['  '.join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
              for r in rows]
    for name, *_ in suite.parts + [('targets', )]:
        path = osp.join(suite.out, f'{name}.out')
        if not osp.isfile(path) or not osp.getsize(path):
            continue
        with open(path) as f:
            text = f.read().splitlines()
        if name.endswith('_tests'):
            text = [line for line in text if line.startswith(
                ('FAILED', 'ERROR', 'SKIPPED')) or ' passed' in line
                or ' failed' in line]
        lines += ['', f'== {name}'] + text
    return '\n'.join(lines)


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    out = osp.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    if not args.cpu_smoke:
        env.pop('TRITON_INTERPRET', None)  # compiled kernels on the GPU
    suite = Suite(out, args.seconds, env)
    run_parts(suite, sizes(args.cpu_smoke))
    try:  # results, not checks: never fails the suite
        targets = evaluate(out)
        write_json(targets, osp.join(out, 'targets.json'))
        write_text(osp.join(out, 'targets.out'),
                   format_targets(targets) + '\n')
        if args.json:
            write_json(targets, args.json)
        if args.markdown:
            write_text(args.markdown, format_targets(targets, True) + '\n')
    except Exception as error:  # reported; the parts' results stand
        print(f'gpu suite: the targets failed: {error!r}', file=sys.stderr)
    text = summary(suite, time.monotonic() - start)
    write_text(osp.join(out, 'summary.txt'), text + '\n')
    print(text)
    return 0 if all(p[1] == 'pass' for p in suite.parts) else 1
