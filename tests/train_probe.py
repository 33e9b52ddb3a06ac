"""A test-only hook, imported by training runs under test through
``custom_imports`` (with ``tests/`` on ``PYTHONPATH``).

``TrainProbeHook`` writes ``probe_rank<r>.pth`` into the work dir: the image
paths of every training batch this rank saw, its losses and its final model
parameters (not buffers: mmengine's DDP does not broadcast BN statistics).
With ``kill_at_iter=i`` it kills its own process (SIGKILL, no clean-up)
before iteration ``i`` runs, i.e. after ``i`` iterations and their
checkpoints: an interrupted run.
"""
import os
import os.path as osp
import signal

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmseg.registry import HOOKS


@HOOKS.register_module()
class TrainProbeHook(Hook):

    def __init__(self, kill_at_iter=None):
        self.kill_at_iter = kill_at_iter
        self.samples = []
        self.losses = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.kill_at_iter:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.samples.append(
            [sample.img_path for sample in data_batch['data_samples']])
        self.losses.append(float(outputs['loss']))

    def after_train(self, runner):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        torch.save(
            dict(samples=self.samples, losses=self.losses,
                 params={n: p.detach() for n, p in model.named_parameters()}),
            osp.join(runner.work_dir, f'probe_rank{get_rank()}.pth'))
