"""The mmseg part of the plugin: import this module to use MiTA in mmseg.

Configs load it with
``custom_imports = dict(imports=['mmseg_mita.mmseg_plugin'],
allow_failed_imports=False)`` (inherited from
``configs/_base_/default_runtime.py``); scripts with
``import mmseg_mita.mmseg_plugin  # noqa: F401``. Nothing else in the
package changes torch, mmengine or mmseg; importing this module changes,
once:

* mmseg's registries: ``MODELS`` gets ``MiTAViT`` and ``CBTHead``,
  ``TRANSFORMS`` gets ``CheckSegMap`` (:mod:`mmseg_mita.models`,
  :mod:`mmseg_mita.datasets`);
* mmengine's ``CheckpointLoader``: every scheme mmengine registers (local
  files, ``http(s)://``, ``s3://``/``petrel://``, ``pavi://`` and the model
  zoos) is read by a loader of :mod:`mmseg_mita.checkpoint_schemes`, that
  is by :func:`mmseg_mita.safe_load.load_checkpoint`, which refuses files
  that would run code, drops a stored config text that would, and reports
  damaged ones (this serves ``load_from``, ``--resume``, ``tools/test.py``
  and ``init_cfg=dict(type='Pretrained')``); ``load_checkpoint`` refuses a
  scheme registered later by another package;
* mmengine's ``_init_dist_pytorch`` / ``_init_dist_slurm``,
  ``MMDistributedDataParallel.__init__`` and ``AmpOptimWrapper.__init__``:
  wrapped to work without CUDA (the CUDA path is unchanged);
* mmengine's ``Runner._maybe_compile``: ``compile=True`` compiles the
  network's forward, not the training step with its optimizer (which
  dynamo cannot trace);
* mmseg's ``BaseSegDataset.load_data_list``: wrapped to name a missing or
  empty data folder.

Nothing is added to torch's safe globals (the loader admits its entries
for the duration of a load only). Details: :mod:`mmseg_mita.compat`.
"""
from . import compat
from . import datasets, models  # noqa: F401  (fill mmseg's registries)

compat.apply()
