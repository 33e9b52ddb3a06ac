"""The targets of the GPU suite, read from the documents of one run of
``python -m mmseg_mita.bench gpu OUT_DIR``.

:func:`evaluate` reads ``OUT_DIR``'s ``op_shapes_*.json`` (subcommand
``op-shapes``), ``encoder_*.json`` (``encoder``), ``throughput_1d_*.json``
(``throughput-1d``) and the junit XML of the CUDA op tests
(``op_tests.xml``), and returns one row per target: its measured value,
the target, whether it is met, and which measurement gave it. The rows of
several files of one kind (e.g. ``op_shapes_cuda_bfloat16.json`` from the
eager and CUDA-graph run and ``op_shapes_compile_cuda_bfloat16.json``) are
merged. A target without a measurement gets ``measured: None, met: False``
and a ``why``: nothing is invented. The targets are stated on the
workloads of :mod:`.workloads` (op shapes, encoder settings, 1-D lengths).
Rules:

* op targets: speed-up = the best SDPA time (over its modes) / the best
  MiTA time over backends and modes (eager, compiled, cudagraph) at that
  N x BH, forward+backward. A backend whose CUDA tests failed is left out,
  and so is a graph-captured mode whose result differs from eager by more
  than ``GRAPH_TOLERANCE`` (relative).
* 1-D throughput: the best ``speedup_vs_sdpa`` over backends and m, k
  settings at that N.
* encoder: the best MiTA time (over backends and modes) / the best SDPA
  encoder time (over modes) for that step kind and token count.
* ``auto_backend``: at each op shape, the correct backend with the fastest
  time (the rule ``backend='auto'`` should follow); reported, ``met`` is
  None (not a pass/fail).
"""
import glob
import json
import os.path as osp
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional

from .report import Column, format_table

# Graph-captured results further than this from eager (largest relative
# error of the output and gradients, bf16) do not count as measurements.
GRAPH_TOLERANCE = 0.05

OP_TARGETS = (  # key, N, batch x heads, minimum speed-up over SDPA
    ('op_fwd_bwd_1025x12', 1025, 12, 1.0),
    ('op_fwd_bwd_1025x96', 1025, 96, 2.0),
    ('op_fwd_bwd_4097x12', 4097, 12, 5.0),
    ('op_fwd_bwd_65537x1', 65537, 1, 30.0),
)
THROUGHPUT_TARGETS = (  # key, N, minimum speed-up in tokens/s over SDPA
    ('throughput_1d_64k', 65536, 19.0),
    ('throughput_1d_256k', 262144, 56.0),
)
ENCODER_TARGETS = (  # key, kind, tokens, maximum time ratio MiTA / SDPA
    ('encoder_train_1025', 'train', 1025, 1.0),
    ('encoder_train_4097', 'train', 4097, 0.6),
    ('encoder_infer_8193', 'infer', 8193, 0.35),
)
AUTO_KEY = 'auto_backend'
TARGET_KEYS = tuple(t[0] for t in OP_TARGETS + THROUGHPUT_TARGETS +
                    ENCODER_TARGETS) + (AUTO_KEY,)


def _load(out_dir: str, pattern: str):
    """(names, merged document) of the JSON files matching ``pattern``
    (``None`` when there is none): the ``rows`` concatenated, the
    ``settings.backends`` joined."""
    paths = sorted(p for p in glob.glob(osp.join(out_dir, pattern))
                   if not osp.basename(p).startswith('.'))
    merged, names = None, []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        names.append(osp.basename(path))
        merged = merged or dict(rows=[], backends=[])
        merged['rows'] += data.get('rows', [])
        merged['backends'] += data.get('settings', {}).get('backends', [])
    return ', '.join(names) or None, merged


def _merge_shapes(data):
    """Op rows of several runs grouped per (N, BH): method -> mode -> the
    row (the faster of two rows of one method and mode)."""
    shapes = {}
    for row in (data or {}).get('rows', []):
        key = (row.get('tokens'), row.get('bh'))
        merged = shapes.setdefault(key, dict(tokens=key[0], bh=key[1],
                                             methods={}))
        modes = merged['methods'].setdefault(row.get('method'), {})
        old = modes.get(row.get('mode'))
        if old is None or 'best_s' not in old or (
                'best_s' in row and row['best_s'] < old['best_s']):
            modes[row.get('mode')] = row
    return list(shapes.values())


def backend_correctness(out_dir: str, backends) -> Dict[str, Optional[bool]]:
    """Per backend: False if a test naming it failed in ``op_tests.xml``
    of ``out_dir``, True if some passed and none failed, None if none ran."""
    passed = {b: 0 for b in backends}
    failed = {b: 0 for b in backends}
    try:
        cases = list(ET.parse(osp.join(out_dir, 'op_tests.xml')).getroot()
                     .iter('testcase'))
    except (OSError, ET.ParseError):
        cases = []
    for case in cases:
        outcome = {child.tag for child in case}
        for b in backends:
            if b not in case.get('name', ''):
                continue
            if outcome & {'failure', 'error'}:
                failed[b] += 1
            elif 'skipped' not in outcome:
                passed[b] += 1
    return {b: False if failed[b] else (True if passed[b] else None)
            for b in backends}


def _row(key, what, target, baseline, measured=None, met=False, **extra):
    row = dict(key=key, what=what, target=target, baseline=baseline,
               measured=measured, met=met)
    row.update(extra)
    return row


def _op_entries(record: dict, correct: dict):
    """(method, mode, seconds) of the usable measurements of one shape."""
    for method, modes in record.get('methods', {}).items():
        backend = method[5:] if method.startswith('mita_') else None
        if backend is not None and correct.get(backend) is False:
            continue
        for mode, e in modes.items():
            if 'best_s' not in e:
                continue
            if e.get('rel_err_vs_eager', 0.0) > GRAPH_TOLERANCE:
                continue
            yield method, mode, e['best_s']


def _op_rows(data, path, correct) -> List[dict]:
    rows = []
    for key, n, bh, bound in OP_TARGETS:
        row = _row(key, f'MiTA op forward+backward at N={n} x BH={bh} '
                   '(head_dim 64, m = k = 49)', f'speed-up >= {bound}x',
                   'F.scaled_dot_product_attention, same inputs, same run')
        record = next((r for r in _merge_shapes(data)
                       if r['tokens'] == n and r['bh'] == bh), None)
        if record is None:
            row['why'] = ('no op_shapes_*.json in the run' if data is None
                          else f'no measurement at N={n} x BH={bh} in '
                          f'{path}')
            rows.append(row)
            continue
        entries = list(_op_entries(record, correct))
        sdpa = [e for e in entries if e[0] == 'sdpa']
        mita = [e for e in entries if e[0] != 'sdpa']
        if not sdpa or not mita:
            row['why'] = ('SDPA' if not sdpa else 'MiTA') + (
                f' has no usable measurement at N={n} x BH={bh} (failed, '
                'incorrect or over the graph tolerance)')
            rows.append(row)
            continue
        base, best = min(sdpa, key=lambda e: e[2]), min(mita,
                                                         key=lambda e: e[2])
        speedup = base[2] / best[2]
        row.update(measured=round(speedup, 4), met=speedup >= bound,
                   detail=f'{best[0]} {best[1]} {best[2] * 1e3:.3f} ms vs '
                   f'sdpa {base[1]} {base[2] * 1e3:.3f} ms')
        rows.append(row)
    return rows


def _throughput_rows(data, path) -> List[dict]:
    rows = []
    for key, n, bound in THROUGHPUT_TARGETS:
        row = _row(key, f'1-D throughput (3 layers, dim 128, 2 heads of 64, '
                   f'inference) at N={n}', f'speed-up >= {bound}x',
                   'the same model with F.scaled_dot_product_attention')
        found = [r for r in (data or {}).get('rows', [])
                 if r.get('tokens') == n and r.get('method') != 'sdpa'
                 and 'speedup_vs_sdpa' in r]
        if not found:
            row['why'] = ('no throughput_1d_*.json in the run' if data is None
                          else f'no MiTA speed-up at N={n} in {path}')
        else:
            best = max(found, key=lambda r: r['speedup_vs_sdpa'])
            row.update(measured=round(best['speedup_vs_sdpa'], 4),
                       met=best['speedup_vs_sdpa'] >= bound,
                       detail=f'{best["method"]} m=k={best["m"]}')
        rows.append(row)
    return rows


def _encoder_rows(data, path, correct) -> List[dict]:
    rows = []
    records = [r for r in (data or {}).get('rows', []) if 'best_s' in r]
    for key, kind, n, bound in ENCODER_TARGETS:
        row = _row(key, f'ViT-S/16 encoder {kind} step at {n} tokens',
                   f'time ratio <= {bound}',
                   'the same encoder with F.scaled_dot_product_attention')
        here = [r for r in records if r['kind'] == kind
                and r['tokens'] == n]
        sdpa = [r for r in here if r['method'] == 'sdpa']
        mita = [r for r in here if r['method'] != 'sdpa'
                and correct.get(r['method'][5:]) is not False]
        if not sdpa or not mita:
            row['why'] = ('no encoder_*.json in the run' if data is None else
                          f'no {"SDPA" if not sdpa else "MiTA"} {kind} '
                          f'measurement at {n} tokens in {path}')
        else:
            base = min(sdpa, key=lambda r: r['best_s'])
            best = min(mita, key=lambda r: r['best_s'])
            ratio = best['best_s'] / base['best_s']
            row.update(measured=round(ratio, 4), met=ratio <= bound,
                       detail=f'{best["method"]} {best["mode"]} '
                       f'{best["best_s"] * 1e3:.1f} ms vs sdpa '
                       f'{base["mode"]} {base["best_s"] * 1e3:.1f} ms; '
                       f'peak {best["peak_bytes"] / 2**20:.0f} vs '
                       f'{base["peak_bytes"] / 2**20:.0f} MiB')
        rows.append(row)
    return rows


def _auto_row(data, correct) -> dict:
    row = _row(AUTO_KEY, 'backend that is correct and fastest at each op '
               'shape (the rule auto should follow)', 'reported',
               'op shapes, forward+backward, best mode', met=None)
    fastest = {}
    for record in _merge_shapes(data):
        entries = [e for e in _op_entries(record, correct)
                   if e[0] != 'sdpa']
        if entries:
            method, mode, seconds = min(entries, key=lambda e: e[2])
            fastest[f'{record["tokens"]}x{record["bh"]}'] = dict(
                backend=method[5:], mode=mode, ms=round(seconds * 1e3, 4))
    if fastest:
        row['measured'] = fastest
    else:
        row['why'] = 'no MiTA op measurement in the run'
    row['correct'] = correct
    return row


def evaluate(out_dir: str) -> dict:
    """Every target of one GPU suite run in ``out_dir``."""
    op_path, ops = _load(out_dir, 'op_shapes_*.json')
    enc_path, enc = _load(out_dir, 'encoder_*.json')
    tp_path, tp = _load(out_dir, 'throughput_1d_*.json')
    backends = set()
    for data in (ops, enc):
        backends.update((data or {}).get('backends', []))
    correct = backend_correctness(out_dir, sorted(backends))
    rows = (_op_rows(ops, op_path, correct) + _throughput_rows(tp, tp_path) +
            _encoder_rows(enc, enc_path, correct) + [_auto_row(ops, correct)])
    scored = [r for r in rows if r['met'] is not None]
    return dict(out_dir=osp.abspath(out_dir),
                sources=dict(op_shapes=op_path, encoder=enc_path,
                             throughput_1d=tp_path),
                graph_tolerance=GRAPH_TOLERANCE,
                met=sum(r['met'] for r in scored), scored=len(scored),
                targets=rows)


def _measured(row) -> str:
    if row['key'] == AUTO_KEY:
        return ''
    return '-' if row['measured'] is None else f'{row["measured"]:.3g}'


def _met(row) -> str:
    return '-' if row['met'] is None else ('yes' if row['met'] else 'no')


def _detail(row) -> str:
    if row['key'] == AUTO_KEY and row['measured']:
        return ', '.join(f'{shape}: {v["backend"]} ({v["mode"]})'
                         for shape, v in row['measured'].items())
    return row.get('detail') or row.get('why', '')


COLUMNS = [
    Column('target', 'key', left=True),
    Column('measured', _measured),
    Column('target', 'target', left=True),
    Column('met', _met, left=True),
    Column('detail', _detail, left=True),
]


def format_targets(result: dict, markdown: bool = False) -> str:
    return format_table(result['targets'], COLUMNS, markdown, notes=[
        f'{result["met"]} of {result["scored"]} targets met; speed-up = '
        'SDPA time / MiTA time, ratio = MiTA time / SDPA time (best of '
        'backends and modes each)'
    ])
