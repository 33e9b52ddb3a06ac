"""The AdamW schedules' poly decay ends where training ends: PolyLR has no
``end`` there, and mmengine's Runner gives it the train loop's
``max_iters`` (what ``helpers.scheduled_end`` assumes)."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.runner import Runner


class _Linear(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)

    def forward(self, inputs, mode='loss'):
        return dict(loss=self.linear(inputs).sum())


@pytest.mark.parametrize('schedule,iters', [('160k', 160000), ('80k', 80000)])
def test_poly_decay_ends_at_max_iters(repo_root, tmp_path, schedule, iters):
    cfg = Config.fromfile(
        osp.join(repo_root, 'configs', '_base_', 'schedules',
                 f'schedule_{schedule}_vit_adamw.py'))
    assert cfg.train_cfg.max_iters == iters
    runner = Runner(
        model=_Linear(),
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=[torch.zeros(1)],
            sampler=dict(type='DefaultSampler', shuffle=False),
            batch_size=1),
        optim_wrapper=cfg.optim_wrapper,
        param_scheduler=cfg.param_scheduler,
        train_cfg=dict(by_epoch=False, max_iters=cfg.train_cfg.max_iters))
    runner.train_loop  # the scheduler's default end comes from the loop
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    warmup, poly = runner.build_param_scheduler(cfg.param_scheduler)
    assert (warmup.begin, warmup.end) == (0, 1500)
    assert (type(poly).__name__, poly.begin, poly.end) == ('PolyLR', 1500,
                                                            iters)
