"""Time and peak memory of whole segmentors against the input size: MiTA,
its SDPA full-attention twin and mmseg's own ViT, in one run.

    python tools/benchmark_scaling.py [--heads cbt upernet]
        [--sizes 512x512 1024x1024 1024x2048 2048x2048]
        [--modes inference train] [--models mita sdpa mmseg]
        [--time-budget 60] [--total-budget 840] [--memory-limit-gib 12]
        [--repeats 1] [--threads N] [--json OUT.json] [--markdown OUT.md]
        [--plot OUT.png]

For each decode head (the ViT-S/16 Cityscapes configs:
``mita-vit-s16_{cbt,upernet}_8xb1-80k_cityscapes-1024x1024.py``), mode
(``inference``: the segmentor's forward to logits under ``no_grad``;
``train``: forward and backward of the decode losses on random labels, no
optimizer update) and model (``mita``: the config; ``sdpa``: the same with
``mita_cfg=None, full_attention='sdpa'``; ``mmseg``: the twin with mmseg's
``VisionTransformer``), one worker process builds the model (random
weights, batch 1, BN in eval mode: one image cannot be batch-normalised
after UPerNet's global pooling) and makes one unmeasured call at the first
size. The first head's first mode (CBT inference, where the issue's
targets are) is measured at every size first, then every other series size
by size (the sizes in the order given). Each measurement: first the peak
memory
(``mmseg_mita.benchmarks.peak_memory``; this run is also the warm-up of
the size), then the best of ``--repeats`` timed runs.

Nothing is extrapolated. A run (warm-up, memory or timed) that takes longer
than ``--time-budget`` seconds is killed and reported as "did not finish";
an allocation that fails under the worker's address-space limit
(``--memory-limit-gib``, ``RLIMIT_AS``) is "out of memory"; the larger
sizes of that series are then not run. Once the measurements have taken
``--total-budget`` seconds (model building excluded), the remaining ones
are "not run". The JSON records every measurement with the load average
before and after it.
"""
import argparse
import json
import os
import os.path as osp
import queue
import subprocess
import sys
import threading
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = dict(
    cbt='configs/mita_vit/mita-vit-s16_cbt_8xb1-80k_cityscapes-1024x1024.py',
    upernet='configs/mita_vit/'
    'mita-vit-s16_upernet_8xb1-80k_cityscapes-1024x1024.py')
HEAD_LABELS = dict(cbt='ViT-S + CBT', upernet='ViT-S + UPerNet')
MODELS = ('mita', 'sdpa', 'mmseg')
MODEL_LABELS = dict(mita='MiTA', sdpa='SDPA twin', mmseg="mmseg's ViT")
MODES = ('inference', 'train')
PREFIX = '@@scaling '
STARTUP_TIMEOUT_S = 300  # import and build, not measured


def _size(text):
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'size must be HxW, got {text!r}')
    if min(h, w) < 1:
        raise argparse.ArgumentTypeError(f'size must be positive: {text!r}')
    return h, w


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Segmentor time and peak memory vs input size: MiTA, '
        "SDPA full attention and mmseg's ViT")
    parser.add_argument('--heads', nargs='+', choices=list(CONFIGS),
                        default=list(CONFIGS))
    parser.add_argument(
        '--sizes', nargs='+', type=_size,
        default=[(512, 512), (1024, 1024), (1024, 2048), (2048, 2048)],
        help='input sizes HxW, measured in this order')
    parser.add_argument('--modes', nargs='+', choices=MODES,
                        default=list(MODES))
    parser.add_argument('--models', nargs='+', choices=MODELS,
                        default=list(MODELS))
    parser.add_argument('--time-budget', type=float, default=60.0,
                        help='seconds one run may take before it is killed')
    parser.add_argument('--total-budget', type=float, default=840.0,
                        help='seconds after which no measurement starts')
    parser.add_argument('--memory-limit-gib', type=float, default=12.0,
                        help='address-space limit of each worker (GiB)')
    parser.add_argument('--repeats', type=int, default=1,
                        help='timed runs per measurement (best reported)')
    parser.add_argument('--threads', type=int, default=0,
                        help='torch CPU threads (0: torch default)')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        metavar='KEY=VALUE',
                        help='passed to every model config (mmseg syntax)')
    parser.add_argument('--json', metavar='PATH')
    parser.add_argument('--markdown', metavar='PATH')
    parser.add_argument('--plot', metavar='PNG')
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.time_budget <= 0:
        parser.error('--repeats must be >= 1 and --time-budget > 0')
    return args


# --------------------------------------------------------------- worker


def _emit(**event):
    print(PREFIX + json.dumps(event), flush=True)


def _limit_memory(gib: float) -> None:
    import resource
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and 'allocate' in str(error))


def _return_freed_memory() -> None:
    """Give freed heap memory back to the system: an idle worker otherwise
    keeps the peak of its last measurement resident (measured: 12 workers
    then exhausted a 24 GiB machine and the kernel killed three)."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def run_worker(spec: dict) -> None:
    """One (head, model, mode) series: builds the model, then measures
    every size sent on stdin (a JSON list ``[H, W]`` per line); events on
    stdout."""
    _limit_memory(spec['memory_limit_gib'])
    import torch
    from mmengine.config import Config, DictAction

    from benchmark_backbone import attention_variants, build, make_step
    from mmseg_mita.benchmarks import peak_memory, run_timed
    if spec['threads']:
        torch.set_num_threads(spec['threads'])
    cpu = torch.device('cpu')
    cfg = Config.fromfile(osp.join(ROOT, spec['config']))
    if spec['cfg_options']:
        parser = argparse.ArgumentParser()
        parser.add_argument('--o', nargs='+', action=DictAction)
        cfg.merge_from_dict(
            parser.parse_args(['--o'] + spec['cfg_options']).o)
    import mmseg_mita.mmseg_plugin  # noqa: F401  (MiTA in mmseg)
    model = build(attention_variants(cfg)[spec['model']], 'segmentor', cpu)
    _emit(event='ready')
    warm = False
    for line in sys.stdin:
        size = json.loads(line)
        gen = torch.Generator().manual_seed(0)
        images = torch.randn(1, 3, *size, generator=gen)
        step = make_step(model, 'segmentor', spec['mode'] == 'train', images)
        for module in model.modules():  # batch 1: running statistics
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()
        try:
            if not warm:  # first call: lazy set-up, not measured
                _emit(event='start', size=size, run='warm-up')
                step()
                warm = True
            _emit(event='start', size=size, run='memory')
            peak = peak_memory(step, cpu)
            times = []
            for _ in range(spec['repeats']):
                _emit(event='start', size=size, run='time')
                times.append(run_timed(step, cpu))
        except (RuntimeError, MemoryError) as error:
            if not _is_out_of_memory(error):
                raise
            _emit(event='oom', size=size, error=str(error).splitlines()[0])
            continue
        _emit(event='result', size=size, peak_bytes=peak, best_s=min(times),
              times_s=times)
        del step, images
        _return_freed_memory()


# --------------------------------------------------------------- parent


class SeriesWorker:
    """The worker process of one series; :meth:`measure` one size at a
    time, killing the process when a run exceeds the time budget."""

    def __init__(self, spec: dict):
        env = dict(os.environ)
        env['PYTHONPATH'] = os.pathsep.join(
            [ROOT, osp.join(ROOT, 'tools')] +
            ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
        self.proc = subprocess.Popen(
            [sys.executable, osp.abspath(__file__), '--worker',
             json.dumps(spec)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=ROOT, env=env)
        self.events: 'queue.Queue' = queue.Queue()
        self.stderr_tail = []
        self.ready = False
        self.stopped = None  # why the larger sizes are not run
        for fn in (self._read_stdout, self._read_stderr):
            threading.Thread(target=fn, daemon=True).start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                self.events.put(json.loads(line[len(PREFIX):]))
        self.events.put(None)

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr_tail[:] = (self.stderr_tail + [line])[-20:]

    def wait_ready(self, timeout: float) -> None:
        try:
            event = self.events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            event = None
        self.ready = event is not None and event['event'] == 'ready'
        if not self.ready:
            self.stopped = 'not run: the worker failed to start'
            self.close()

    def _failed(self) -> dict:
        self.close()
        self.stopped = 'not run: the worker failed'
        return dict(status='failed',
                    detail=f'worker exited with {self.proc.returncode}: ' +
                    ''.join(self.stderr_tail[-3:]).strip())

    def measure(self, size, time_budget: float) -> dict:
        try:
            self.proc.stdin.write(json.dumps(list(size)) + '\n')
            self.proc.stdin.flush()
        except OSError:
            return self._failed()
        while True:
            try:
                event = self.events.get(timeout=time_budget)
            except queue.Empty:
                self.close()
                self.stopped = 'not run: a smaller size did not finish'
                return dict(status='did not finish',
                            detail=f'a run took over {time_budget:g} s '
                            '(killed)')
            if event is None:
                return self._failed()
            if event['event'] == 'oom':
                self.close()
                self.stopped = 'not run: a smaller size ran out of memory'
                return dict(status='out of memory', detail=event['error'])
            if event['event'] == 'result':
                return dict(status='ok', best_s=event['best_s'],
                            times_s=event['times_s'],
                            peak_bytes=event['peak_bytes'])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def tokens(size, patch=16):
    """Patch tokens + cls for a ``size`` input (patches rounded up)."""
    return -(-size[0] // patch) * -(-size[1] // patch) + 1


def measurement_order(args) -> list:
    """``(size, (head, mode, model))`` pairs: the first head's first mode
    (by default CBT inference, where the targets are) at every size, then
    size by size every other series, so that the total budget cuts the
    largest sizes rather than whole series."""
    series = [(head, mode, model) for head in args.heads
              for mode in args.modes for model in args.models]
    first = [k for k in series if k[:2] == (args.heads[0], args.modes[0])]
    return [(size, key) for key in first for size in args.sizes] + [
        (size, key) for size in args.sizes for key in series
        if key not in first
    ]


def measure_all(args) -> list:
    """Every measurement of :func:`measurement_order`, in one worker per
    series."""
    series = [(head, mode, model) for head in args.heads
              for mode in args.modes for model in args.models]
    workers = {
        key: SeriesWorker(
            dict(config=CONFIGS[key[0]], mode=key[1], model=key[2],
                 repeats=args.repeats, threads=args.threads,
                 memory_limit_gib=args.memory_limit_gib,
                 cfg_options=args.cfg_options))
        for key in series
    }
    start = time.monotonic()
    for worker in workers.values():
        worker.wait_ready(start + STARTUP_TIMEOUT_S - time.monotonic())
    deadline = time.monotonic() + args.total_budget
    records = []
    try:
        for size, key in measurement_order(args):
            worker = workers[key]
            load_before = os.getloadavg()
            if worker.stopped:
                record = dict(status=worker.stopped)
            elif time.monotonic() > deadline:
                record = dict(status='not run: total budget spent')
            else:
                record = dict(worker.measure(size, args.time_budget),
                              load_before=load_before,
                              load_after=os.getloadavg())
            if worker.stopped:
                worker.close()  # frees its memory for the others
            head, mode, model = key
            records.append(dict(head=head, mode=mode, model=model,
                                size=list(size), tokens=tokens(size),
                                **record))
            print(_progress(records[-1]), flush=True)
    finally:
        for worker in workers.values():
            worker.close()
    return records


def _progress(r):
    what = (f'{r["best_s"]:.3f} s, {r["peak_bytes"] / 2**20:.1f} MiB'
            if r['status'] == 'ok' else r['status'])
    return (f'{r["head"]:<8} {r["mode"]:<9} {r["model"]:<6} '
            f'{r["size"][0]}x{r["size"][1]:<5} {what}')


def _find(records, head, mode, model, size):
    for r in records:
        if (r['head'], r['mode'], r['model'], tuple(r['size'])) == (
                head, mode, model, tuple(size)):
            return r
    return None


def _cell(record, key, fmt, time_budget, memory_limit_gib):
    if record is None:
        return '-'
    status = record['status']
    if status == 'ok':
        return fmt(record[key])
    if status == 'did not finish':
        return f'DNF (> {time_budget:g} s)'
    if status == 'out of memory':
        return f'OOM (> {memory_limit_gib:g} GiB)'
    return status.replace('not run: ', 'not run (') + (
        ')' if status.startswith('not run: ') else '')


def _ratio(a, b, key):
    if a is None or b is None or a['status'] != 'ok' or b['status'] != 'ok':
        return '-'
    return f'{a[key] / b[key]:.3f}'


def markdown_table(result: dict) -> str:
    args = result['args']
    records = result['records']
    budget, limit = args['time_budget'], args['memory_limit_gib']
    lines = [
        '| model | mode | input (tokens) | MiTA s | SDPA twin s | '
        "mmseg's ViT s | MiTA / SDPA time | MiTA / mmseg time | MiTA MiB "
        "| SDPA twin MiB | mmseg's ViT MiB | MiTA / SDPA memory | "
        'MiTA / mmseg memory |',
        '|---|---|---|' + '---:|' * 10
    ]
    for head in args['heads']:
        for mode in args['modes']:
            for size in args['sizes']:
                rec = {m: _find(records, head, mode, m, size) for m in MODELS}
                secs = [_cell(rec[m], 'best_s', lambda v: f'{v:.2f}', budget,
                              limit) for m in MODELS]
                mib = [_cell(rec[m], 'peak_bytes',
                             lambda v: f'{v / 2**20:.0f}', budget, limit)
                       for m in MODELS]
                row = [
                    HEAD_LABELS[head], mode,
                    f'{size[0]} x {size[1]} ({tokens(size)})', *secs,
                    _ratio(rec['mita'], rec['sdpa'], 'best_s'),
                    _ratio(rec['mita'], rec['mmseg'], 'best_s'), *mib,
                    _ratio(rec['mita'], rec['sdpa'], 'peak_bytes'),
                    _ratio(rec['mita'], rec['mmseg'], 'peak_bytes')
                ]
                lines.append('| ' + ' | '.join(row) + ' |')
    return '\n'.join(lines) + '\n'


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from mmseg_mita.utils import write_atomic
    args, records = result['args'], result['records']
    panels = [(h, m) for h in args['heads'] for m in args['modes']]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7),
                             squeeze=False)
    styles = dict(mita='o-', sdpa='s--', mmseg='^:')
    for col, (head, mode) in enumerate(panels):
        for row, (key, unit, scale) in enumerate(
                (('best_s', 'time (s)', 1.0),
                 ('peak_bytes', 'peak memory (MiB)', 2**-20))):
            ax = axes[row][col]
            for model in args['models']:
                done = [r for r in records
                        if (r['head'], r['mode'], r['model']) == (
                            head, mode, model) and r['status'] == 'ok']
                if done:
                    ax.plot([r['tokens'] for r in done],
                            [r[key] * scale for r in done], styles[model],
                            label=MODEL_LABELS[model])
            ax.set_xscale('log')
            ax.set_yscale('log')
            ax.set_xlabel('tokens (patches + cls)')
            ax.set_ylabel(unit)
            ax.set_title(f'{HEAD_LABELS[head]}, {mode}', fontsize=10)
            ax.grid(True, which='both', alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle('Whole segmentor, batch 1, CPU; a missing point did not '
                 f'finish in {args["time_budget"]:g} s, ran out of memory, '
                 'failed or was not run (see the table)', fontsize=10)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format='png', dpi=110))
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return run_worker(json.loads(args.worker))
    import torch

    from mmseg_mita.benchmarks import machine_info
    from mmseg_mita.utils import write_json
    from mmseg_mita.utils import write_atomic
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_info(torch.device('cpu'))
    t0 = time.monotonic()
    records = measure_all(args)
    result = dict(started=started, wall_s=round(time.monotonic() - t0, 1),
                  machine=machine,
                  load_average_end=list(os.getloadavg()),
                  args={k: v for k, v in vars(args).items()
                        if k != 'worker'},
                  records=records)
    result['args']['sizes'] = [list(s) for s in args.sizes]
    table = markdown_table(result)
    print(table)
    if args.json:
        write_json(result, args.json)
    if args.markdown:
        def write(tmp):
            with open(tmp, 'w') as f:
                f.write(table)
        write_atomic(args.markdown, write)
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == '__main__':
    main()
