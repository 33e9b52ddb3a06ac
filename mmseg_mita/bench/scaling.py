"""Whole segmentors against the input size: MiTA, SDPA twin, mmseg's ViT.

For each decode head (``--heads``, the ViT-S/16 Cityscapes configs), mode
(``inference``: the segmentor's logits, ``mode='tensor'``, under
``no_grad``; ``train``: forward and backward of the losses on random
labels, no optimizer update) and model (``--models``: ``mita``, ``sdpa``
its SDPA twin, ``mmseg`` the twin with mmseg's ``VisionTransformer``), one
worker process builds the model (random weights, batch 1, BN in eval mode:
one image cannot be batch-normalised after UPerNet's global pooling) and
makes one unmeasured call at the first size. The first head's first mode
is measured at every size first, then every other series size by size.
Each measurement: the peak memory (:mod:`.measure`; also the warm-up of
the size), then the best of ``--repeats`` timed runs.

Nothing is extrapolated: a run longer than ``--time-budget`` seconds is
killed ("did not finish"), an allocation over the worker's address-space
limit (``--memory-limit-gib``) is "out of memory", and the larger sizes of
that series are not run; once the measurements have taken
``--total-budget`` seconds the rest is "not run". Every row records the
load average before and after it.
"""
import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

from .record import document, finish
from .report import Column, Curve, Panel, format_table, plot_panels
from .workloads import (HEADS, SCALING_SIZES, SEGMENTOR_CONFIGS, image_size,
                        image_tokens)

COMMON = dict(repeats=1, time_budget=60.0, threads=0)
MODELS = ('mita', 'sdpa', 'mmseg')
LABELS = dict(mita='MiTA', sdpa='SDPA twin', mmseg="mmseg's ViT")
MODES = ('inference', 'train')
PREFIX = '@@scaling '
STARTUP_TIMEOUT_S = 300  # import and build, not measured


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--heads', nargs='+', choices=list(HEADS),
                        default=['cbt', 'upernet'])
    parser.add_argument('--sizes', nargs='+', type=image_size,
                        default=[image_size(s) for s in SCALING_SIZES],
                        help='input sizes HxW, measured in this order')
    parser.add_argument('--modes', nargs='+', choices=MODES,
                        default=list(MODES))
    parser.add_argument('--models', nargs='+', choices=MODELS,
                        default=list(MODELS))
    parser.add_argument('--total-budget', type=float, default=840.0,
                        help='seconds after which no measurement starts')
    parser.add_argument('--memory-limit-gib', type=float, default=12.0,
                        help='address-space limit of each worker (GiB)')
    parser.add_argument('--cfg-options', nargs='+', default=[],
                        metavar='KEY=VALUE',
                        help='passed to every model config (mmseg syntax)')
    parser.add_argument('--worker', help=argparse.SUPPRESS)


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
    keeps the peak of its last measurement resident (12 workers then
    exhausted a 24 GiB machine)."""
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
    from mmengine.config import DictAction

    from .measure import peak_memory, run_timed
    from .segmentors import (attention_variants, build, inference_step,
                             load_config, random_images, training_step)
    cpu = torch.device('cpu')
    options = None
    if spec['cfg_options']:
        parser = argparse.ArgumentParser()
        parser.add_argument('--o', nargs='+', action=DictAction)
        options = parser.parse_args(['--o'] + spec['cfg_options']).o
    cfg = load_config(spec['config'], options)
    model = build(attention_variants(cfg)[spec['model']], cpu)
    _emit(event='ready')
    warm = False
    for line in sys.stdin:
        size = json.loads(line)
        images = random_images(1, size, 0, cpu)
        if spec['mode'] == 'train':
            step = training_step(model, images, 0)
        else:
            step = inference_step(model, images, predict=False)
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

    def __init__(self, spec: dict, threads: int):
        command = [sys.executable, '-m', 'mmseg_mita.bench', 'scaling',
                   '--worker', json.dumps(spec)]
        if threads:
            command += ['--threads', str(threads)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.events: 'queue.Queue' = queue.Queue()
        self.stderr_tail = []
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
        if event is None or event['event'] != 'ready':
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


def measurement_order(args) -> list:
    """``(size, (head, mode, model))`` pairs: the first head's first mode
    at every size, then size by size every other series, so that the
    total budget cuts the largest sizes rather than whole series."""
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
            dict(config=SEGMENTOR_CONFIGS[(key[0], 'cityscapes')],
                 mode=key[1], model=key[2], repeats=args.repeats,
                 memory_limit_gib=args.memory_limit_gib,
                 cfg_options=args.cfg_options), args.threads)
        for key in series
    }
    start = time.monotonic()
    for worker in workers.values():
        worker.wait_ready(start + STARTUP_TIMEOUT_S - time.monotonic())
    deadline = time.monotonic() + args.total_budget
    rows = []
    try:
        for size, key in measurement_order(args):
            worker = workers[key]
            load_before = os.getloadavg()
            if worker.stopped:
                row = dict(status=worker.stopped)
            elif time.monotonic() > deadline:
                row = dict(status='not run: total budget spent')
            else:
                row = dict(worker.measure(size, args.time_budget),
                           load_before=load_before,
                           load_after=os.getloadavg())
            if worker.stopped:
                worker.close()  # frees its memory for the others
            head, mode, model = key
            rows.append(dict(head=head, mode=mode, model=model,
                             size=list(size), tokens=image_tokens(size),
                             **row))
            print(_progress(rows[-1]), file=sys.stderr, flush=True)
    finally:
        for worker in workers.values():
            worker.close()
    return rows


def _progress(r):
    what = (f'{r["best_s"]:.3f} s, {r["peak_bytes"] / 2**20:.1f} MiB'
            if r['status'] == 'ok' else r['status'])
    return (f'{r["head"]:<8} {r["mode"]:<9} {r["model"]:<6} '
            f'{r["size"][0]}x{r["size"][1]:<5} {what}')


def run(args: argparse.Namespace) -> int:
    if args.worker:
        run_worker(json.loads(args.worker))
        return 0
    doc = document(args)
    doc['settings']['sizes'] = [list(s) for s in args.sizes]
    start = time.monotonic()
    doc['rows'] = measure_all(args)
    doc['wall_s'] = round(time.monotonic() - start, 1)
    finish(doc, args, table, plot)
    return 0


# --------------------------------------------------------------- output


def _series_label(head: str) -> str:
    method, backbone = HEADS[head]
    return f'{backbone} + {method}'


def _cell(key, scale, fmt):
    """A cell of one model's value, or why there is none."""
    def cell(model, settings):
        def value(pivot):
            r = pivot.get(model)
            if r is None:
                return None
            if r['status'] == 'ok':
                return fmt.format(r[key] * scale)
            if r['status'] == 'did not finish':
                return f'DNF (> {settings["time_budget"]:g} s)'
            if r['status'] == 'out of memory':
                return f'OOM (> {settings["memory_limit_gib"]:g} GiB)'
            return r['status'].replace('not run: ', 'not run (') + (
                ')' if r['status'].startswith('not run: ') else '')
        return value
    return cell


def _ratio(key):
    def ratio(a, b):
        def value(pivot):
            x, y = pivot.get(a), pivot.get(b)
            if x is None or y is None or 'ok' != x['status'] or (
                    'ok' != y['status']):
                return None
            return f'{x[key] / y[key]:.3f}'
        return value
    return ratio


def _pivot(doc: dict) -> list:
    """One row per (head, mode, size): model -> its row."""
    settings = doc['settings']
    out = []
    for head in settings['heads']:
        for mode in settings['modes']:
            for size in settings['sizes']:
                pivot = {r['model']: r for r in doc['rows']
                         if (r['head'], r['mode'], r['size']) == (
                             head, mode, list(size))}
                out.append(dict(pivot, _head=head, _mode=mode,
                                _size=list(size)))
    return out


def table(doc: dict, markdown: bool) -> str:
    settings = doc['settings']
    seconds = _cell('best_s', 1.0, '{:.2f}')
    mib = _cell('peak_bytes', 2**-20, '{:.0f}')
    time_ratio, memory_ratio = _ratio('best_s'), _ratio('peak_bytes')
    columns = [
        Column('model', lambda p: _series_label(p['_head']), left=True),
        Column('mode', '_mode', left=True),
        Column('input (tokens)', lambda p: f'{p["_size"][0]} x '
               f'{p["_size"][1]} ({image_tokens(p["_size"])})', left=True)]
    columns += [Column(f'{LABELS[m]} s', seconds(m, settings))
                for m in MODELS]
    columns += [Column('MiTA / SDPA time', time_ratio('mita', 'sdpa')),
                Column('MiTA / mmseg time', time_ratio('mita', 'mmseg'))]
    columns += [Column(f'{LABELS[m]} MiB', mib(m, settings))
                for m in MODELS]
    columns += [Column('MiTA / SDPA memory', memory_ratio('mita', 'sdpa')),
                Column('MiTA / mmseg memory', memory_ratio('mita', 'mmseg'))]
    return format_table(_pivot(doc), columns, markdown)


def plot(doc: dict, path: str) -> None:
    """Time and peak memory against tokens, one column per (head, mode)."""
    settings, rows = doc['settings'], doc['rows']
    styles = dict(mita='o-', sdpa='s--', mmseg='^:')
    panels = []
    for key, unit, scale in (('best_s', 'time (s)', 1.0),
                             ('peak_bytes', 'peak memory (MiB)', 2**-20)):
        for head in settings['heads']:
            for mode in settings['modes']:
                curves = []
                for model in settings['models']:
                    done = [r for r in rows
                            if (r['head'], r['mode'], r['model']) == (
                                head, mode, model) and r['status'] == 'ok']
                    if done:
                        curves.append(Curve(
                            LABELS[model], [r['tokens'] for r in done],
                            [r[key] * scale for r in done], styles[model]))
                panels.append(Panel(f'{_series_label(head)}, {mode}',
                                    'tokens (patches + cls)', unit, curves))
    plot_panels(path, panels, columns=len(panels) // 2,
                title='Whole segmentor, batch 1; a missing point did not '
                f'finish in {settings["time_budget"]:g} s, ran out of '
                'memory, failed or was not run (see the table)')
