"""An interrupted run resumed with --resume ends where an uninterrupted run
ends: same iteration, parameters, optimizer state, learning rate and
message hub; a checkpoint whose stored config is Python is refused before
mmengine runs it."""
import os.path as osp
import signal

import pytest
import torch

from helpers import (DEMO_CONFIG, PROBE_ENV, data_opts, probe_config,
                     run_python)
from mmseg_mita.safe_load import UNSAFE_ENV


def _train(repo_root, config, work_dir, data_root, *args, options=(),
           returncode=0):
    return run_python(
        repo_root, ['tools/train.py', config, '--work-dir', work_dir] +
        list(args) + ['--cfg-options'] + data_opts(data_root) +
        ['randomness.seed=0', 'randomness.deterministic=True'] +
        # mmengine does not checkpoint RNG states: dropout masks drawn after
        # a resume differ from the uninterrupted run's (docs/training.md)
        ['model.decode_head.dropout_ratio=0',
         'model.auxiliary_head.dropout_ratio=0'] + list(options),
        returncode=returncode, env=PROBE_ENV)


@pytest.fixture(scope='module')
def runs(repo_root, demo_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp('resume')
    config = probe_config(tmp)
    straight, broken = str(tmp / 'straight'), str(tmp / 'interrupted')
    _train(repo_root, config, straight, demo_data)
    # SIGKILL before iteration 3 runs, i.e. after iter_2.pth was saved
    _train(repo_root, config, broken, demo_data,
           options=['custom_hooks.0.kill_at_iter=2'],
           returncode=-signal.SIGKILL)
    interrupted = sorted(p for p in ('iter_2.pth', 'iter_4.pth')
                         if osp.isfile(osp.join(broken, p)))
    out = _train(repo_root, config, broken, demo_data, '--resume')
    return out, interrupted, *(torch.load(
        osp.join(d, 'iter_4.pth'), weights_only=False)
                               for d in (straight, broken))


def test_interrupted_run_stopped_after_its_checkpoint(runs):
    out, interrupted, _, _ = runs
    assert interrupted == ['iter_2.pth']
    assert 'resumed epoch: 0, iter: 2' in out


def test_resumed_equals_uninterrupted(runs):
    _, _, straight, resumed = runs
    assert straight['meta']['iter'] == resumed['meta']['iter'] == 4
    assert straight['state_dict'].keys() == resumed['state_dict'].keys()
    for key, value in straight['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key
    a, b = straight['optimizer'], resumed['optimizer']
    assert a['param_groups'] == b['param_groups']  # lr, betas, ...
    assert a['state'].keys() == b['state'].keys()
    for i, state in a['state'].items():
        for name, value in state.items():
            assert torch.equal(value, b['state'][i][name]), (i, name)
    assert straight['param_schedulers'] == resumed['param_schedulers']
    # the logged history (restored up to iteration 2, then appended)
    for key in ('train/lr', 'train/loss'):
        history = [c['message_hub']['log_scalars'][key].data[0]
                   for c in (straight, resumed)]
        assert history[0].tolist() == history[1].tolist(), key
    hubs = [c['message_hub'] for c in (straight, resumed)]
    assert hubs[0].keys() == hubs[1].keys()
    assert hubs[0]['runtime_info'].keys() == hubs[1]['runtime_info'].keys()
    for key in ('iter', 'max_iters', 'epoch', 'dataset_meta'):
        assert hubs[0]['runtime_info'][key] == hubs[1]['runtime_info'][key]


def test_resume_runs_no_code_from_the_stored_config(repo_root, demo_data,
                                                    trained, tmp_path):
    """``--resume`` from a checkpoint whose ``meta['config']`` (MMCV 1.x's
    key, which ``Runner.resume`` runs as Python) writes a file: the text is
    dropped with a warning, nothing run, the run resumed (at its last
    iteration: nothing left to train); with the opt-in mmengine runs it
    (the path is live)."""
    checkpoint = torch.load(osp.join(trained, 'iter_4.pth'),
                            weights_only=False)
    marker = tmp_path / 'marker'
    checkpoint['meta']['config'] = (
        f"x = dict(a=(lambda: open({str(marker)!r}, 'w').close())())\n")
    work = tmp_path / 'work'
    work.mkdir()
    torch.save(checkpoint, work / 'iter_4.pth')
    (work / 'last_checkpoint').write_text(str(work / 'iter_4.pth'))
    args = ['tools/train.py', DEMO_CONFIG, '--work-dir', str(work),
            '--resume', '--cfg-options'] + data_opts(demo_data)
    out = run_python(repo_root, args, env={UNSAFE_ENV: '0'})
    assert "dropped its config text ['meta']['config'], which mmengine " \
        'runs' in out
    assert 'has a call on line 1' in out and f'{UNSAFE_ENV}=1' in out
    assert 'resumed epoch: 0, iter: 4' in out
    assert not marker.exists()
    # trusted: resumed at its last iteration, mmengine runs the text
    run_python(repo_root, args, env={UNSAFE_ENV: '1'})
    assert marker.exists()
