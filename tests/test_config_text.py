"""The config text a checkpoint holds (``meta['config']``, ``meta['cfg']``,
the message hub's ``cfg``), which mmengine runs as Python when it resumes
(``Runner.resume``) or builds a model from a checkpoint (its inferencers),
is read as data (mmseg_mita/safe_load/config_text.py): each attack below
(most run code through mmengine's ``Config.fromstring``) is dropped by the
loader with a warning naming the key and what the text does, the rest of
the checkpoint loading; the text mmengine writes for every config of ours
loads as written. (The whole resume: tests/test_resume.py.)"""
import re
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.runner.checkpoint import CheckpointLoader

import mmseg_mita.mmseg_plugin  # noqa: F401  (mmengine's loader)
from mmseg_mita import config_path, list_configs
from mmseg_mita.safe_load import UNSAFE_ENV
from mmseg_mita.safe_load.config_text import MAX_CHARS, MAX_DEPTH

PLACEHOLDER = "x = {{'$MMSEG_MITA_NO_SUCH_VARIABLE:True'}}\n"
# name -> (text writing the file MARKER when mmengine runs it, or None for
# a text that only costs time or memory; what the refusal says)
ATTACKS = {
    'import line': ("import os\nos.system('touch MARKER')\n",
                    r"has an import .* on line 1 \('import os'\)"),
    '__import__ in an f-string':
    ("x = f\"{__import__('os').system('touch MARKER')}\"\n",
     'has an f-string on line 1'),
    'lambda in a dict value, called':
    ("x = dict(a=(lambda: open('MARKER', 'w'))())\n", 'has a call on line 1'),
    'a builtin called with keywords':
    ("x = open(file='MARKER', mode='w')\n", 'has a call on line 1'),
    'lambda in a dict value': ("x = dict(a=lambda: 1)\n",
                               'has a lambda on line 1'),
    # a set of a set of a string to the parser, the default (True) once
    # mmengine substituted the placeholder, quotes and braces included
    'placeholder': (PLACEHOLDER, r"has a '\{\{' placeholder on line 1"),
    '_base_ naming a file': ("_base_ = ['BASE']\n",
                             'assigns _base_ on line 1'),
    'custom_imports of a module not imported':
    ("custom_imports = dict(imports=['mita_config_attack'])\n",
     r"imports \['mita_config_attack'\] through custom_imports"),
    'builtins replaced': ('__builtins__ = dict()\n',
                          'assigns __builtins__ on line 1'),
    'dict replaced': ('dict = 1\nx = dict(a=1)\n', 'assigns dict on line 1'),
    'attribute access': ("x = ().__class__.__base__\n",
                         'has an attribute on line 1'),
    'very long text': (None, f'more than {MAX_CHARS}'),
    'nested too deeply': (None, f'nests values more than {MAX_DEPTH} deep'),
    'nested beyond the parser': (None, 'is no Python mmengine writes'),
}
PLACES = {
    "['meta']['config']": lambda text: {'meta': {'config': text}},
    "['meta']['cfg']": lambda text: {'meta': {'cfg': text}},
    "['message_hub']['runtime_info']['cfg']":
    lambda text: {'message_hub': {'runtime_info': {'cfg': text}}},
}


def _text(attack, tmp_path):
    """The attack's text, its files written under ``tmp_path``."""
    marker = str(tmp_path / 'marker')
    if attack == 'very long text':
        return "x = '" + 'a' * MAX_CHARS + "'\n"
    if attack == 'nested too deeply':
        return 'x = ' + '[' * (MAX_DEPTH + 1) + ']' * (MAX_DEPTH + 1)
    if attack == 'nested beyond the parser':
        return 'x = ' + '[' * 100_000 + ']' * 100_000
    base = tmp_path / 'base.py'
    base.write_text(f"x = open({marker!r}, 'w')\n")
    (tmp_path / 'mita_config_attack.py').write_text(
        f"open({marker!r}, 'w')\n")
    return ATTACKS[attack][0].replace('MARKER', marker).replace(
        'BASE', str(base))


@pytest.mark.parametrize('place', list(PLACES))
@pytest.mark.parametrize('attack', list(ATTACKS))
def test_config_text_that_runs_code_is_dropped(attack, place, tmp_path,
                                               monkeypatch):
    monkeypatch.delenv(UNSAFE_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))  # custom_imports finds it
    text = _text(attack, tmp_path)
    path = str(tmp_path / 'ckpt.pth')
    saved = {'state_dict': {'w': torch.ones(2)}, **PLACES[place](text)}
    torch.save(saved, path)
    with pytest.warns(UserWarning) as caught:
        loaded = CheckpointLoader.load_checkpoint(path)
    message = str(caught[-1].message)
    assert f'checkpoint {path}: dropped its config text {place}, which ' \
        'mmengine runs as Python' in message
    assert re.search(ATTACKS[attack][1], message), message
    assert f'{UNSAFE_ENV}=1' in message
    assert torch.equal(loaded['state_dict']['w'], torch.ones(2))
    keys = place[2:-2].split("']['")
    owner = loaded
    for key in keys[:-1]:
        owner = owner[key]
    assert owner == {}  # the text is gone, its parents kept
    assert not (tmp_path / 'marker').exists()


@pytest.mark.parametrize(
    'attack', ['__import__ in an f-string', 'lambda in a dict value, called',
               'a builtin called with keywords',
               '_base_ naming a file',
               'custom_imports of a module not imported'])
def test_attacks_are_live(attack, tmp_path, monkeypatch):
    """What the loader refuses does run code in mmengine's
    ``Config.fromstring`` (which ``Runner.resume`` calls). (An import line
    switches mmengine 0.10 to its lazy-import mode, which failed before
    the code ran; the loader refuses it all the same.)"""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mita_config_attack', raising=False)
    try:
        Config.fromstring(_text(attack, tmp_path), '.py')
    except Exception:  # noqa: B902  (what happens after the code ran)
        pass
    assert (tmp_path / 'marker').exists()


def test_placeholders_change_the_text_mmengine_runs():
    """A placeholder turns the text that was parsed into other text before
    mmengine runs it: here a set of sets (which would fail) into ``True``.
    (mmengine 0.10 also uses the default as a regular expression, which
    rules out parentheses; the loader does not rely on that.)"""
    assert Config.fromstring(PLACEHOLDER, '.py')['x'] is True


@pytest.mark.parametrize('name', list_configs())
def test_the_text_mmengine_writes_loads(name, tmp_path):
    text = Config.fromfile(config_path(name)).pretty_text
    path = str(tmp_path / 'ckpt.pth')
    want = {'meta': {'cfg': text, 'config': text},
            'message_hub': {'runtime_info': {'cfg': text}}}
    torch.save(want, path)
    assert CheckpointLoader.load_checkpoint(path) == want


def test_keys_that_are_no_identifiers_load(tmp_path):
    """``pretty_text`` writes ``dict({...})`` where a key has a dot."""
    text = ("custom_keys = dict({'backbone.norm': dict(decay_mult=0.0)})\n"
            "x = {'a b': -1, 2: (None, True, 1.5e-3, {1, 2})}\n")
    assert Config.fromstring(text, '.py')['custom_keys'] == {
        'backbone.norm': {'decay_mult': 0.0}}
    path = str(tmp_path / 'ckpt.pth')
    torch.save({'meta': {'cfg': text}}, path)
    assert CheckpointLoader.load_checkpoint(path)['meta']['cfg'] == text


def test_opt_in_keeps_the_text(tmp_path, monkeypatch):
    path = str(tmp_path / 'ckpt.pth')
    torch.save({'meta': {'config': 'import os\n'}}, path)
    monkeypatch.setenv(UNSAFE_ENV, '1')
    with pytest.warns(UserWarning, match='full unpickling'):
        assert CheckpointLoader.load_checkpoint(path)['meta'] == {
            'config': 'import os\n'}


def test_config_mmengine_cannot_read_back_is_dropped_not_refused(tmp_path):
    """A config holding ``float('inf')``, which ``pretty_text`` writes as
    ``inf`` (mmengine cannot run it back either): the checkpoint loads."""
    text = Config(dict(clip=dict(max_norm=float('inf')))).pretty_text
    assert text == 'clip = dict(max_norm=inf)\n'
    path = str(tmp_path / 'ckpt.pth')
    torch.save({'state_dict': {'w': torch.ones(1)}, 'meta': {'cfg': text}},
               path)
    with pytest.warns(UserWarning, match=r"dropped its config text "
                      r"\['meta'\]\['cfg'\].*has a name on line 1"):
        assert CheckpointLoader.load_checkpoint(path)['meta'] == {}
