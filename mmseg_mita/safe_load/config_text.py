"""The config text a checkpoint carries, checked to be data.

mmengine's runner stores its config as Python text (``Config.pretty_text``)
in ``meta['cfg']`` and ``message_hub['runtime_info']['cfg']``; MMCV 1.x
runners stored it in ``meta['config']``. mmengine turns that text back into
a ``Config`` by running it: ``Runner.resume`` runs ``meta['config']`` (to
compare ``gpu_ids``), the inferencers run ``meta['cfg']`` or the message
hub's ``cfg`` when built from a checkpoint alone. ``Config.fromstring``
writes the text to a file and executes it as a config file: it first
substitutes ``{{ ... }}`` placeholders in the raw text (environment
variables, ``_base_`` values, file names: a placeholder inside a quoted
string becomes code once its quotes are substituted away), reads the
files ``_base_`` names, runs the statements, then imports
``custom_imports``.

:func:`check_config_text` admits a text only if running it that way can
do nothing but assign plain values, which is all ``pretty_text`` writes:

* statements ``name = value`` only, ``name`` neither ``_base_`` (it reads
  other files), a dunder, nor ``dict`` (which the values call);
* values built from ``None``, booleans, numbers, strings, lists, tuples,
  sets, dict displays, ``dict(key=value, ...)`` and ``dict({...})``
  (where a key is no identifier), nested at most
  :data:`MAX_DEPTH` deep; a number may carry a sign;
* ``custom_imports`` naming modules already imported (importing them again
  runs nothing: the plugin itself, which every config of ours names);
* no ``{{`` anywhere in the text, at most :data:`MAX_CHARS` characters.

Anything else (imports, calls, lambdas, f-strings, attribute access,
comprehensions, a placeholder) is refused, naming the line and what it
does, and :func:`drop_code_texts` removes such a text from the loaded
checkpoint with a warning: its weights and training state still load
(a config holding a class or a function, which ``pretty_text`` writes as
``<class ...>``, is no Python either, and mmengine's runner never runs the
text it writes itself). Nothing of the text is run here: it is parsed
with :func:`ast.parse`, which executes nothing.
"""
import ast
import sys
import warnings
from typing import Any

from .errors import UNSAFE_ENV, Refused, brief

# Where mmengine's runners and inferencers read config text from.
CONFIG_TEXT_KEYS = (('meta', 'config'), ('meta', 'cfg'),
                    ('message_hub', 'runtime_info', 'cfg'))
MAX_CHARS = 1 << 21  # a config's pretty_text is some 10 KB
MAX_DEPTH = 64  # mmseg's configs nest dicts about 6 deep
_FORBIDDEN_NAMES = frozenset({'_base_', 'dict'})


def drop_code_texts(checkpoint: Any, name: str) -> None:
    """Remove from ``checkpoint`` (the file ``name``) each config text of
    :data:`CONFIG_TEXT_KEYS` that is not data (:func:`check_config_text`),
    with a warning saying which and why: the weights, optimizer and the
    rest load, and mmengine finds no text to run (``Runner.resume`` then
    skips its ``gpu_ids`` comparison; an inferencer needs the config
    given)."""
    for keys in CONFIG_TEXT_KEYS:
        owner = checkpoint
        for key in keys[:-1]:
            owner = owner.get(key) if isinstance(owner, dict) else None
        text = owner.get(keys[-1]) if isinstance(owner, dict) else None
        if not isinstance(text, str):
            continue
        try:
            check_config_text(text)
        except Refused as e:
            del owner[keys[-1]]
            where = ''.join(f'[{key!r}]' for key in keys)
            warnings.warn(
                f'checkpoint {name}: dropped its config text {where}, which '
                'mmengine runs as Python when it resumes from or builds a '
                f'model of the checkpoint: it {e} (admitted: the '
                "assignments of plain values that mmengine's "
                'Config.pretty_text writes). Nothing of it was run; the '
                'rest of the checkpoint loads. If you trust the file, set '
                f'{UNSAFE_ENV}=1 to keep it.', stacklevel=2)


def check_config_text(text: str) -> None:
    """Raise :class:`.Refused` unless ``text`` is assignments of plain
    values (the module docstring)."""
    if len(text) > MAX_CHARS:
        raise Refused(f'has {len(text)} characters, more than {MAX_CHARS}')
    if '{{' in text:
        line = text.count('\n', 0, text.index('{{')) + 1
        raise Refused(f"has a '{{{{' placeholder on line {line}, which "
                      'mmengine substitutes in the text before running it')
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise Refused(f'is no Python mmengine writes ({type(e).__name__}: '
                      f'{brief(str(e))})') from None
    try:
        for statement in tree.body:
            name = _assigned_name(statement)
            if name == 'custom_imports':
                _check_imports(statement.value)
            else:
                _check_value(statement.value, 1)
    except _Refused as e:
        line = text.splitlines()[e.node.lineno - 1].strip()
        raise Refused(f'{e.what} on line {e.node.lineno} '
                      f'({brief(line)})') from None


class _Refused(Exception):
    """What a check found (``what``) and where (``node``)."""

    def __init__(self, what: str, node: ast.AST):
        super().__init__(what)
        self.what, self.node = what, node


def _assigned_name(statement: ast.stmt) -> str:
    if not (type(statement) is ast.Assign and len(statement.targets) == 1
            and type(statement.targets[0]) is ast.Name):
        raise _Refused(f'has {_kind(statement)} (not an assignment to one '
                       'name)', statement)
    name = statement.targets[0].id
    if name in _FORBIDDEN_NAMES or name.startswith('__'):
        raise _Refused(f'assigns {name}', statement)
    return name


def _check_value(node: ast.AST, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Refused(f'nests values more than {MAX_DEPTH} deep', node)
    kind = type(node)
    if kind is ast.Constant and type(node.value) in (
            type(None), bool, int, float, str):
        return
    if kind is ast.UnaryOp and type(node.op) in (ast.USub, ast.UAdd) \
            and type(node.operand) is ast.Constant \
            and type(node.operand.value) in (int, float):
        return
    if kind in (ast.List, ast.Tuple, ast.Set):
        children = node.elts
    elif kind is ast.Dict:
        if None in node.keys:  # {**mapping}
            raise _Refused('has a dict unpacking a mapping (**)', node)
        children = node.keys + node.values
    elif kind is ast.Call and type(node.func) is ast.Name \
            and node.func.id == 'dict' and len(node.args) <= 1 \
            and all(type(a) is ast.Dict for a in node.args) \
            and all(k.arg is not None for k in node.keywords):
        # dict(key=value, ...); dict({...}) where a key is no identifier
        children = node.args + [k.value for k in node.keywords]
    else:
        raise _Refused(f'has {_kind(node)}', node)
    for child in children:
        _check_value(child, depth + 1)


def _check_imports(node: ast.AST) -> None:
    """``custom_imports``: a plain dict whose ``imports`` are modules this
    process has imported already."""
    _check_value(node, 1)
    try:
        value = ast.literal_eval(node) if type(node) is not ast.Call else \
            dict(*map(ast.literal_eval, node.args),
                 **{k.arg: ast.literal_eval(k.value) for k in node.keywords})
    except (TypeError, ValueError) as e:  # {[1]: 2}, a set of lists, ...
        raise _Refused(f'has a custom_imports mmengine cannot read ({e})',
                       node) from None
    imports = value.get('imports', []) if isinstance(value, dict) else []
    if isinstance(imports, str):
        imports = [imports]
    new = sorted(str(name) for name in imports if name not in sys.modules)
    if new:
        raise _Refused(f'imports {brief(new)} through custom_imports '
                       '(admitted: modules already imported)', node)


_KINDS = {'joinedstr': 'an f-string', 'binop': 'an operator',
          'expr': 'an expression'}


def _kind(node: ast.AST) -> str:
    """``a call``, ``an f-string``, ... (for a message)."""
    name = type(node).__name__.lower()
    return _KINDS.get(name) or ('an ' if name[0] in 'aeiou' else 'a ') + name
