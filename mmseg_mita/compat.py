"""Workarounds for defects of the mmsegmentation 1.2.2 stack.

Applied by :mod:`mmseg_mita.mmseg_plugin` (configs import it through
``custom_imports``), so users of mmseg's own tools never see them. Each one
leaves the CUDA code path as mmengine wrote it.

* Checkpoints. torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``.
  mmengine 0.10.7 calls it without the argument, and its own checkpoints
  pickle the message hub (``HistoryBuffer`` objects with numpy arrays and
  the buffers' statistics methods, reached through ``getattr``), so
  ``tools/test.py``, ``--resume`` and ``load_from`` refuse every checkpoint
  mmengine wrote; its loaders of URLs and model zoos unpickle with full
  ``torch.load``. Checkpoints of every scheme mmengine registers (local
  files, URLs, model zoos, file backends:
  :mod:`mmseg_mita.checkpoint_schemes`) are read by
  :func:`mmseg_mita.safe_load.load_checkpoint`: torch's weights-only
  unpickler with exactly what mmengine's, timm's, DeiT's, mmpretrain's and
  mmseg's checkpoints hold admitted for the load, after checks of what torch
  does not check; anything else is refused before any of it runs (opt-in
  for trusted files: ``MMSEG_MITA_UNSAFE_LOAD=1``). A corrupt or truncated
  file is reported as such, with its path and size, instead of torch's
  zip/pickle internals (a zip member failing its CRC-32 check too: a
  flipped bit, which ``torch.load`` does not notice); safetensors files
  load too, ``.npz`` files are refused with the command that converts
  them.
* Distributed training without CUDA (``--launcher pytorch|slurm`` with the
  gloo backend). mmengine's launchers call ``torch.cuda.set_device`` and
  its runner gives ``MMDistributedDataParallel`` ``device_ids``; both are
  fatal on a CPU machine. There, the device is not set, ``nccl`` (mmseg's
  default ``env_cfg.dist_cfg``) falls back to ``gloo``, and modules whose
  parameters are on the CPU are wrapped without ``device_ids``, which is
  what torch's DDP requires for CPU modules. A gloo process group still
  alive when the interpreter exits makes the process abort now and then
  (``terminate called without an active exception``, exit status -6,
  after all the work succeeded), so these processes destroy their process
  group at exit.
* ``--amp`` without CUDA. mmengine's ``AmpOptimWrapper`` asserts an
  accelerator, although its ``autocast`` supports the CPU (bfloat16). On
  CPU it autocasts to bfloat16 without loss scaling: bfloat16 has the
  exponent range of float32, so gradients do not underflow.
* ``compile=True``. mmengine 0.10.7 compiles ``model.train_step``,
  which holds the optimizer step: dynamo fails inside torch's AdamW
  (``InternalTorchDynamoError: 'UserDefinedDictVariable' object has no
  attribute 'items'``) for every config. The runner now compiles the
  network instead (:func:`mmseg_mita.models.compile.compile_network`: the
  forward of the backbone, neck and heads) and leaves the data samples,
  losses and optimizer step eager; ``compile=dict(...)`` passes its
  options to ``torch.compile`` (an option it does not take is an error).
* Datasets. A missing image folder surfaces as a bare ``FileNotFoundError``
  from ``os.scandir``, and an empty one makes ``InfiniteSampler`` loop
  forever on zero indices. mmseg's datasets now fail at construction,
  naming ``data_root`` and the folder.
"""
import atexit
import contextlib
import functools

import torch
import torch.distributed as dist
from mmengine.device import get_device
from mmengine.dist import utils as dist_utils
from mmengine.logging import print_log
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmseg_mita import checkpoint_schemes
from mmseg_mita.models.compile import compile_network, compile_options

_PATCHED = '_mmseg_mita_patched'


def _patch(owner, name: str, make_wrapper) -> None:
    """Replace ``owner.name`` by ``make_wrapper(original)``, once."""
    original = getattr(owner, name)
    if getattr(original, _PATCHED, False):
        return
    wrapper = functools.wraps(original)(make_wrapper(original))
    setattr(wrapper, _PATCHED, True)
    setattr(owner, name, wrapper)


# --- checkpoints -----------------------------------------------------------


def allow_mmengine_checkpoints() -> None:
    """Every scheme of mmengine's ``CheckpointLoader`` read by the safe
    loader, any other refused (:mod:`mmseg_mita.checkpoint_schemes`)."""
    checkpoint_schemes.register()
    _patch(CheckpointLoader, 'load_checkpoint',
           checkpoint_schemes.covered_only)


# --- distributed training without CUDA -------------------------------------


@contextlib.contextmanager
def _cuda_set_device_skipped():
    """``torch.cuda.set_device`` as a no-op (there is no device to set)."""
    set_device = torch.cuda.set_device
    torch.cuda.set_device = lambda device: None
    try:
        yield
    finally:
        torch.cuda.set_device = set_device


def _cpu_launcher(init):
    """Run an mmengine launcher (``_init_dist_pytorch``/``_slurm``) on a
    machine without any accelerator."""

    def wrapper(backend, *args, **kwargs):
        if get_device() != 'cpu':
            return init(backend, *args, **kwargs)
        if backend == 'nccl':
            print_log(
                "No CUDA device: distributed backend 'nccl' replaced by "
                "'gloo' (set env_cfg.dist_cfg.backend='gloo' to silence "
                'this)',
                logger='current')
            backend = 'gloo'
        with _cuda_set_device_skipped():
            init(backend, *args, **kwargs)
        atexit.register(_destroy_process_group)

    return wrapper


def _destroy_process_group() -> None:
    """Tear the default process group down before the interpreter exits
    (with it still alive, gloo aborts the process now and then)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _cpu_ddp(init):
    """``MMDistributedDataParallel.__init__`` dropping ``device_ids`` for a
    module on the CPU (torch's DDP accepts none there)."""

    def wrapper(self, module, *args, **kwargs):
        if kwargs.get('device_ids') is not None and all(
                p.device.type == 'cpu' for p in module.parameters()):
            kwargs['device_ids'] = None
        init(self, module, *args, **kwargs)

    return wrapper


def allow_cpu_distributed() -> None:
    _patch(dist_utils, '_init_dist_pytorch', _cpu_launcher)
    _patch(dist_utils, '_init_dist_slurm', _cpu_launcher)
    _patch(MMDistributedDataParallel, '__init__', _cpu_ddp)


# --- mixed precision without CUDA ------------------------------------------


def _cpu_amp(init):
    """``AmpOptimWrapper.__init__`` that works without an accelerator:
    bfloat16 autocast, no loss scaling."""

    def wrapper(self, loss_scale='dynamic', dtype=None, use_fsdp=False,
                **kwargs):
        if get_device() != 'cpu':
            return init(self, loss_scale, dtype, use_fsdp, **kwargs)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, dtype)
        if dtype not in (None, torch.bfloat16):
            raise ValueError(
                f'optim_wrapper.dtype={dtype} is not available without '
                "CUDA: CPU autocast computes in bfloat16; drop dtype or set "
                "dtype='bfloat16'")
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        # A disabled scaler: scale/unscale_/update do nothing, step() steps.
        self.loss_scaler = torch.amp.GradScaler('cpu', enabled=False)
        self.cast_dtype = torch.bfloat16

    return wrapper


def allow_cpu_amp() -> None:
    _patch(AmpOptimWrapper, '__init__', _cpu_amp)


# --- torch.compile ---------------------------------------------------------


def _network_compiled(maybe_compile):
    """``Runner._maybe_compile('train_step')`` compiling the network's
    forward instead of the training step (other targets unchanged)."""

    def wrapper(self, target):
        cfg = self.cfg.get('compile', None)
        if target != 'train_step' or cfg is None or cfg is False:
            return maybe_compile(self, target)
        options = compile_options(cfg)
        model = self.model.module if is_model_wrapper(
            self.model) else self.model
        names = compile_network(model, **options)
        self.logger.info(
            f'compile: torch.compile({options or ""}) of the forward of '
            f'{", ".join(names)}; data samples, losses and the optimizer '
            'step stay eager. The first iterations compile (slow).')

    return wrapper


def compile_network_only() -> None:
    _patch(Runner, '_maybe_compile', _network_compiled)


# --- datasets --------------------------------------------------------------


def _checked_load_data_list(load_data_list):
    """``BaseSegDataset.load_data_list`` failing clearly on a missing or
    empty image folder."""

    def wrapper(self):
        img_dir = self.data_prefix.get('img_path')
        where = (f'data_root={self.data_root!r}, data_prefix.img_path='
                 f'{img_dir!r}' + (f', ann_file={self.ann_file!r}'
                                   if self.ann_file else ''))
        fix = ('Point data_root at the dataset, e.g. `--cfg-options '
               'train_dataloader.dataset.data_root=PATH '
               'val_dataloader.dataset.data_root=PATH '
               'test_dataloader.dataset.data_root=PATH`, or create it (the '
               'demo data: `python tools/make_demo_data.py PATH`)')
        try:
            data_list = load_data_list(self)
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f'{type(self).__name__}: the dataset folder does not exist '
                f'({where}; {e}). {fix}') from e
        if not data_list:
            raise ValueError(
                f'{type(self).__name__}: found no images ending in '
                f'{self.img_suffix!r} ({where}). {fix}')
        return data_list

    return wrapper


def check_seg_datasets() -> None:
    from mmseg.datasets import BaseSegDataset
    _patch(BaseSegDataset, 'load_data_list', _checked_load_data_list)


def apply() -> None:
    """Every workaround (called by :mod:`mmseg_mita.mmseg_plugin`)."""
    allow_mmengine_checkpoints()
    allow_cpu_distributed()
    allow_cpu_amp()
    compile_network_only()
    check_seg_datasets()
