"""The mutation pass of docs/testing.md: each one-line mutation is applied
alone to a fresh clone of this checkout's HEAD, the tests named for it run
(stopping at the first failure) and the change is reverted. Prints one line
per mutation: CAUGHT (with the first failing test) or MISSED.

    .venv/bin/python scripts/mutation_pass.py   # about 8 min on 2 cores
    .venv/bin/python scripts/mutation_pass.py export helper   # only the
                          # mutations whose name contains one of the words
    .venv/bin/python scripts/mutation_pass.py   # about 5 min on 2 cores
    .venv/bin/python scripts/mutation_pass.py 'GPU targets'  # those only

Arguments select the mutations whose name contains one of them.
"""
import os.path as osp
import subprocess
import sys
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
VIT = 'mmseg_mita/models/backbones/mita_vit.py'
OP = 'mmseg_mita/ops/mita_attention.py'
OPTIONS = 'mmseg_mita/ops/options.py'
REPORT = 'mmseg_mita/bench/report.py'
BACKENDS = 'mmseg_mita/ops/backends.py'
DECLARATION = 'mmseg_mita/ops/declaration.py'
PLAN = 'mmseg_mita/ops/plan.py'
BACKEND_TEST = ['tests/ops/test_backends.py', 'tests/ops/test_variants.py']
FUSED = 'mmseg_mita/ops/triton_backend/'  # the fused backend's package
FUSED_BACKWARD = FUSED + 'backward.py'
FUSED_CUSTOM_OPS = FUSED + 'custom_ops.py'
FUSED_HELPERS = FUSED + 'helpers.py'
FUSED_KEYS = FUSED + 'keys.py'
FUSED_MERGE = FUSED + 'merge.py'
FUSED_POOLING = FUSED + 'pooling.py'
FUSED_SETTINGS = FUSED + 'settings.py'
FUSED_TOPK = FUSED + 'topk.py'
ROUTING = 'mmseg_mita/ops/routing.py'
ROUTING_TEST = ['tests/ops/test_routing.py']
TARGETS = 'mmseg_mita/bench/targets.py'
TARGETS_TEST = ['tests/bench/test_targets.py']
COMPILE = 'mmseg_mita/models/compile.py'
COMPILE_TEST = 'tests/models/test_compile.py::'
SEGMENTOR = 'mmseg_mita/bench/segmentor.py'
SEGMENTOR_TEST = 'tests/bench/test_segmentor.py::'
LAYER_TEST = ['tests/models/test_mita_vit.py']
CHECK_TEST = ['tests/ops/test_dropout_and_checks.py']
TRITON_TEST = ['tests/ops/test_triton_backend.py']
TRITON_TEST_FILE = 'tests/ops/test_triton_backend.py::'
TRITON_REF = [TRITON_TEST_FILE + 'test_float32_matches_reference']
TRITON_GPU_TILES = [TRITON_TEST_FILE + 'test_gpu_tiles_match_reference']
TRITON_SORT = [
    TRITON_TEST_FILE + 'test_counting_sort_matches_a_plain_reference'
]
TRITON_ROUTING = [
    TRITON_TEST_FILE +
    'test_routing_is_the_first_argmax_and_nan_rows_go_to_expert_0'
]
TRITON_ROUTED = [
    TRITON_TEST_FILE + 'test_expert_with_one_query_more_than_a_block'
]
TRITON_TOPK = [
    TRITON_TEST_FILE + 'test_topk_is_the_largest_logits_lower_token_on_ties'
]
TRITON_CHUNKS = [
    TRITON_TEST_FILE + 'test_topk_by_chunk_maxima_is_exact'
]
TRITON_WAVES = [
    TRITON_TEST_FILE + 'test_every_launch_fills_an_h200_at_65537_tokens'
]
TRITON_KEYS_TILE = [TRITON_TEST_FILE + 'test_keys_pass_tiles_its_landmarks']
TRITON_FWD_STAGES = [TRITON_TEST_FILE + 'test_experts_forward_pipelines_'
                     'only_loops_of_several_trips']
POOL_CHECK = 'if pool_size[0] > hw[0] or pool_size[1] > hw[1]:'
TORCH_BACKEND = 'mmseg_mita/ops/torch_backend.py'
EXPORT = 'mmseg_mita/deploy/onnx_export.py'
EXPORT_TEST = 'tests/deploy/test_export_onnx.py::'
LOW = 'tests/ops/low_precision.py'
LOW_TEST = ['tests/ops/test_low_precision.py']
SASS = 'mmseg_mita/bench/sass.py'
SASS_TEST = ['tests/bench/test_sass.py']
HARDWARE = 'mmseg_mita/bench/hardware.py'
HARDWARE_TEST = ['tests/bench/test_hardware.py']
MODEL = 'mmseg_mita/bench/kernels.py'
MODEL_TEST = ['tests/bench/test_kernels.py']
SAFE_LOAD = 'mmseg_mita/safe_load/'
ALLOWED, ARCHIVE, ERRORS, LOADER, SCAN = (
    SAFE_LOAD + name + '.py'
    for name in ('allowed', 'archive', 'errors', 'loader', 'scan'))
CONFIG_TEXT = SAFE_LOAD + 'config_text.py'
CONFIG_TEXT_TEST = ['tests/test_config_text.py']
SCHEMES = 'mmseg_mita/checkpoint_schemes.py'
SCHEMES_TEST = ['tests/test_checkpoint_schemes.py']
ATTACK_TEST = [
    'tests/test_safe_load.py::test_crafted_file_is_refused_everywhere'
]
PACKAGING_TEST = ['tests/test_packaging.py']
CONFIG_TEST = ['tests/test_config_files.py']
# name, file, old (must occur once), new, tests
MUTATIONS = [
    ('MiTA layer residual from its normalised input', VIT,
     'identity = query if identity is None else identity', 'identity = query',
     LAYER_TEST),
    ('patch grid handed to the layers as (W, H)', VIT,
     'x = layer(x, hw_shape)', 'x = layer(x, hw_shape[::-1])', LAYER_TEST),
    ('num_extra_tokens fixed to 1', VIT,
     'num_extra_tokens=1 if self.with_cls_token else 0,',
     'num_extra_tokens=1,', LAYER_TEST),
    ('experts_per_query not reduced on a small landmark grid', OPTIONS,
     'experts_per_query=min(self.experts_per_query, pool[0] * pool[1]))',
     'experts_per_query=self.experts_per_query)',
     ['tests/models/test_any_input_shape.py']),
    ('landmark grid fitted with the patch grid read as (W, H)', OPTIONS,
     'zip(self.pool_size, hw))', 'zip(self.pool_size, hw[::-1]))',
     ['tests/models/test_any_input_shape.py']),
    ('bench rates lose their trailing zeros', REPORT,
     "return f'{v:#.{digits}g}'", "return f'{v:.{digits}g}'",
     ['tests/bench/test_cli.py']),
    ('a backend\'s declared head_dim limit not checked', DECLARATION,
     'if self.max_head_dim is not None and d > self.max_head_dim:',
     'if self.max_head_dim is not None and d > self.max_head_dim + 8:',
     BACKEND_TEST),
    ('auto ignoring what the first backend cannot run', BACKENDS,
     '        if not reasons:',
     "        if not reasons or name == 'auto':", BACKEND_TEST),
    ('auto that finds no backend names the last candidate only', BACKENDS,
     "refused[candidate] = '; '.join(reasons)",
     "refused = {candidate: '; '.join(reasons)}", BACKEND_TEST),
    ('triton imported with the operator (not deferred)', BACKENDS,
     '    register_backend(_module.BACKEND)\n',
     "    register_backend(_module.BACKEND)\nget_backend('triton')\n",
     ['tests/test_package_imports.py::'
      'test_operator_imports_with_torch_alone']),
    ('triton collected by importlib (a graph break under torch.compile)',
     BACKENDS, '    from .triton_backend import BACKEND  # imports triton',
     "    BACKEND = __import__('importlib').import_module("
     "'.triton_backend', __package__).BACKEND", TRITON_TEST),
    ('plan: topk not clipped to N', PLAN, '    return min(topk, num_tokens)',
     '    return topk', BACKEND_TEST),
    ('options validated twice', OPTIONS,
     "object.__setattr__(self, 'pool_size', _checked(self, prefix))",
     "object.__setattr__(self, 'pool_size', _checked(self, prefix)) or "
     '_checked(self, prefix)', BACKEND_TEST),
    ('mita_cfg errors without the mita_cfg. prefix', OPTIONS,
     'return cls(**fields, prefix=prefix)', 'return cls(**fields)',
     BACKEND_TEST),
    ('set_attention_backend switches the backbone but not its layers', VIT,
     '        self._use_mita(dataclasses.replace(self.mita, backend=backend),',
     '        self.mita = dataclasses.replace(self.mita, backend=backend)\n'
     '        (dataclasses.replace(self.mita, backend=backend),',
     LAYER_TEST),
    ('attention dropout in eval mode', VIT,
     'dropout_p = mha.dropout if self.training else 0.0',
     'dropout_p = mha.dropout', LAYER_TEST),
    ('pool-size check along H only', OP, POOL_CHECK,
     'if pool_size[0] > hw[0]:', CHECK_TEST),
    ('pool-size check along W only', OP, POOL_CHECK,
     'if pool_size[1] > hw[1]:', CHECK_TEST),
    ('dropout probability not passed to flash-attn',
     'mmseg_mita/ops/flash_backend.py',
     'keys_per_expert, dropout_p=dropout_p,',
     'keys_per_expert, dropout_p=0.0,', CHECK_TEST),
    ('dropout without its 1 / (1 - p) rescale (torch backend)',
     'mmseg_mita/ops/torch_backend.py', 'used = used * mask / (1 - dropout_p)',
     'used = used * mask', CHECK_TEST),
    ('bit-flipped checkpoint not reported', ARCHIVE,
     '    if bad is not None:', '    if False:',
     ['tests/test_bad_input.py::test_corrupt_checkpoint',
      'tests/converters/test_convert_vit.py::'
      'test_bit_flipped_file_is_refused']),
    ('damaged deflate stream of an .npz not caught (raw zlib.error)',
     ARCHIVE, 'except (zipfile.BadZipFile, zlib.error, EOFError, OSError,',
     'except (zipfile.BadZipFile, EOFError, OSError,',
     ['tests/converters/test_convert_vit.py::'
      'test_npz_with_damaged_deflate_stream_is_refused']),
    ('zip whose directory offsets point outside the file not caught',
     ARCHIVE, 'except (zipfile.BadZipFile, zlib.error, EOFError, OSError,',
     'except (zipfile.BadZipFile, zlib.error, EOFError,',
     ['tests/test_bad_input.py::test_corrupt_checkpoint']),
    ("checkpoint loader: zip central directory not at the stated offset",
     ARCHIVE, '    if offset + dir_size != end:', '    if False:',
     ATTACK_TEST),
    ('checkpoint loader: zip64 locator not checked', ARCHIVE,
     '        if stated != end or record[0] != _END64_SIG:',
     '        if False:', ATTACK_TEST),
    ('checkpoint loader: zip end record not the last 22 bytes', ARCHIVE,
     '    if sig != _END_SIG or comment:', '    if False:', ATTACK_TEST),
    ('checkpoint loader: zip member with two zip64 fields', ARCHIVE,
     '    if info.compress_size != info.file_size or fields > 1:',
     '    if info.compress_size != info.file_size:', ATTACK_TEST),
    ('checkpoint loader: TorchScript archive not refused', ARCHIVE,
     "    if 'constants.pkl' in records:", '    if False:', ATTACK_TEST),
    ('checkpoint loader: no bound on decompression', ARCHIVE,
     '            if total > max(MAX_INFLATION * size, MIN_INFLATION_BOUND):',
     '            if False:', ATTACK_TEST),
    ('checkpoint loader: global names not checked before torch', SCAN,
     '                if name not in ALLOWED:', '                if False:',
     ATTACK_TEST),
    ('checkpoint loader: zip storage claims not checked', SCAN,
     '            if size != nbytes:', '            if False:', ATTACK_TEST),
    ('checkpoint loader: legacy storages read past the end of the file',
     SCAN, '            if len(header) < 8 or end > self.file_size:',
     '            if len(header) < 8:', ATTACK_TEST),
    ('checkpoint loader: claimed but unlisted legacy storage admitted',
     SCAN, '        if unlisted:', '        if False:', ATTACK_TEST),
    ('checkpoint loader: any codec and bytearray(n) admitted', SCAN,
     "    '_codecs.encode': _encode,", "    # '_codecs.encode': _encode,",
     ATTACK_TEST),
    ('checkpoint loader: quantized tensor larger than its storage', SCAN,
     '        torch._utils._element_size(storage.dtype)\n'
     '    if nbytes > storage.nbytes:',
     '        torch._utils._element_size(storage.dtype)\n    if False:',
     ATTACK_TEST),
    ('checkpoint loader: numpy dtype state not checked', ALLOWED,
     '        if not (type(state) is tuple and len(state) == 8',
     '        if False and not (type(state) is tuple and len(state) == 8',
     ATTACK_TEST),
    ('checkpoint loader: numpy dtype kind not checked', ALLOWED,
     '    if not (type(spec) is str and spec in NUMPY_DTYPES',
     '    if not (type(spec) is str', ATTACK_TEST),
    ('checkpoint loader: statistics methods of a HistoryBuffer not checked',
     ALLOWED, '        if type(methods) is not dict or any(',
     '        if type(methods) is not dict or False and any(', ATTACK_TEST),
    ('checkpoint loader: getattr admitted for any HistoryBuffer attribute',
     ALLOWED,
     '    if owner is _PendingHistoryBuffer and name in STATISTICS:',
     '    if owner is _PendingHistoryBuffer:', ATTACK_TEST),
    ('checkpoint loader: pending objects not resolved', LOADER,
     '    return resolve(loaded)', '    return loaded',
     ['tests/test_checkpoint_formats.py']),
    ('checkpoint loader: a tensor view not bounded by its storage', SCAN,
     "    nbytes = _numel(size, 'a tensor') * "
     'torch._utils._element_size(dtype)', '    nbytes = 0', ATTACK_TEST),
    ('checkpoint loader: config text not checked', LOADER,
     '                drop_code_texts(loaded, name or path)',
     '                pass', CONFIG_TEXT_TEST),
    ("config text: the message hub's cfg not checked", CONFIG_TEXT,
     "                    ('message_hub', 'runtime_info', 'cfg'))", ')',
     CONFIG_TEXT_TEST),
    ('config text: placeholders admitted', CONFIG_TEXT,
     "    if '{{' in text:", '    if False:', CONFIG_TEXT_TEST),
    ('config text: calls of any name admitted', CONFIG_TEXT,
     "            and node.func.id == 'dict' and len(node.args) <= 1 \\",
     '            and len(node.args) <= 1 \\', CONFIG_TEXT_TEST),
    ('config text: custom_imports of any module admitted', CONFIG_TEXT,
     '    new = sorted(str(name) for name in imports if name not in '
     'sys.modules)', '    new = []', CONFIG_TEXT_TEST),
    ('config text: no bound on nesting', CONFIG_TEXT,
     '    if depth > MAX_DEPTH:', '    if False:', CONFIG_TEXT_TEST),
    ('config text: _base_ admitted', CONFIG_TEXT,
     "_FORBIDDEN_NAMES = frozenset({'_base_', 'dict'})",
     "_FORBIDDEN_NAMES = frozenset({'dict'})", CONFIG_TEXT_TEST),
    ("checkpoint schemes: mmengine's http loader kept", SCHEMES,
     "    ('http://', 'https://'): load_from_http,",
     "    ('http://', 'https://'): mmengine_checkpoint.load_from_http,",
     SCHEMES_TEST),
    ('checkpoint schemes: a scheme registered later trusted', SCHEMES,
     '        if loader not in COVERED and not unsafe_load_allowed():',
     '        if False:', SCHEMES_TEST),
    ('checkpoint schemes: the download cache not used', SCHEMES,
     '    if not osp.exists(cached):', '    if True:', SCHEMES_TEST),
    ('unsafe-load opt-in on by default', ERRORS,
     'return os.environ.get(UNSAFE_ENV) == ',
     "return os.environ.get(UNSAFE_ENV, '1') == ",
     ['tests/test_safe_load.py::test_opt_in_loads_a_trusted_file']),
    ("mmengine's loader back to full unpickling", SCHEMES,
     "    ('', ): load_from_local,",
     "    ('', ): mmengine_checkpoint.load_from_local,", ATTACK_TEST),
    ("importing the loader adds torch safe globals", ALLOWED,
     '_LOCK = threading.Lock()',
     '_LOCK = threading.Lock(); torch.serialization.add_safe_globals('
     'ENTRIES)',
     ['tests/test_package_imports.py::'
      'test_operator_import_leaves_the_stack_untouched']),
    ('FLOPs closed form without the routing matmul',
     'mmseg_mita/analysis/flop_handles.py', 'mita_routing=m * n * c,',
     'mita_routing=0,', ['tests/analysis/test_flops.py']),
    ('Triton softmax backward with the wrong sign', FUSED_HELPERS,
     'return p * (dp - delta[:, None])', 'return p * (dp + delta[:, None])',
     TRITON_TEST),
    ('Triton online softmax without rescaling its accumulator', FUSED_HELPERS,
     'acc = acc * alpha[:, None] + _dot(', 'acc = acc + _dot(',
     ['tests/ops/test_triton_backend.py']),
    ('compression-only dropout without its 1 / (1 - p) rescale',
     TORCH_BACKEND, 'probs = F.dropout(probs, dropout_p)',
     'probs = probs * (torch.rand_like(probs) >= dropout_p)', CHECK_TEST),
    ('dropout without its 1 / (1 - p) rescale in the backward only',
     TORCH_BACKEND, 'grad_logits.mul_(mask).div_(1 - dropout_p)',
     'grad_logits.mul_(mask)', CHECK_TEST),
    ('torch backend: its Function output modified in place in forward',
     TORCH_BACKEND,
     'out = torch.baddbmm(out, used[:, :m].view(g, n, m),\n'
     '                                shared_values)',
     'out += torch.bmm(used[:, :m].view(g, n, m), shared_values)', [
         'tests/ops/test_torch_compile.py::'
         'test_function_output_is_not_modified_in_place'
     ]),
    ('Triton interpreter: bf16 tl.dot operands not upcast', FUSED_SETTINGS,
     'self.upcast = interpreted() and dtype == torch.bfloat16',
     'self.upcast = False', [
         'tests/ops/test_triton_backend.py::'
         'test_half_precision_within_twice_the_torch_backend_error'
     ]),
    ('dynamic export: position-embedding grid as (W, H)', EXPORT,
     'pos_embed, hw_shape, pos_grid,', 'pos_embed, hw_shape, pos_grid[::-1],',
     [EXPORT_TEST + 'test_dynamic_export_of_a_non_square_backbone']),
    ('dynamic export: patch padding of H and W swapped', EXPORT,
     'return F.pad(x, [0, pads[1], 0, pads[0]])',
     'return F.pad(x, [0, pads[0], 0, pads[1]])',
     [EXPORT_TEST + 'test_dynamic_export_runs_at_other_sizes']),
    ('compare_logits: agreement over the width axis', EXPORT,
     'agree = reference.argmax(1) == logits.argmax(1)',
     'agree = reference.argmax(-1) == logits.argmax(-1)',
     [EXPORT_TEST + 'test_compare_logits_counts_pixels_of_the_same_class']),
    ('compare_logits: agreement over the batch axis', EXPORT,
     'agree = reference.argmax(1) == logits.argmax(1)',
     'agree = reference.argmax(0) == logits.argmax(0)',
     [EXPORT_TEST + 'test_compare_logits_counts_pixels_of_the_same_class']),
    ('export tool: --min-agreement ignored',
     'mmseg_mita/deploy/export_tool.py',
     'within_tolerance(result, args.atol, args.min_agreement)',
     'within_tolerance(result, args.atol, 0)',
     [EXPORT_TEST + 'test_tool_fails_on_swapped_classes']),
    ('low-precision helper: factor 20 instead of 2', LOW, 'factor=2.0,',
     'factor=20.0,', LOW_TEST),
    ('low-precision helper: backend compared with itself', LOW,
     "{'backend': backend_fn, 'torch': baseline_fn}",
     "{'backend': backend_fn, 'torch': backend_fn}", LOW_TEST),
    ('low-precision helper: gradient errors not compared with torch\'s', LOW,
     "zip(names, errors['backend'], errors['torch'])",
     "zip(names[:1], errors['backend'], errors['torch'])", LOW_TEST),
    ('low-precision helper: absolute gradient bound dropped', LOW,
     'assert errs[0] < bounds[0] and max(errs[1:]) < bounds[1], errors',
     'assert errs[0] < bounds[0], errors', LOW_TEST),
    ('low-precision helper: baseline not bounded', LOW,
     'for errs in errors.values():', "for errs in [errors['backend']]:",
     LOW_TEST),
    ('low-precision helper: routing not held fixed', LOW,
     '._replace(**fixed)', '._replace()', LOW_TEST),
    ('float64 comparison helper: gradients not compared',
     'tests/ops/mita_testing.py',
     'for (name, _), g1, g2 in zip(named, got, want):',
     'for (name, _), g1, g2 in zip(named[:0], got, want):', LOW_TEST),
    ('float64 comparison helper: gradient tolerance 1e-3',
     'tests/ops/mita_testing.py', 'grad_rtol=1e-9, grad_atol=1e-9):',
     'grad_rtol=1e-3, grad_atol=1e-3):', LOW_TEST),
    ('export: checkpoint loaded without strict', EXPORT,
     "load_checkpoint(model, checkpoint, map_location='cpu', strict=True)",
     "load_checkpoint(model, checkpoint, map_location='cpu', strict=False)",
     [EXPORT_TEST + 'test_export_from_checkpoint']),
    ('block layout capacity one block short per group', ROUTING,
     'return num_tokens // block + min(num_experts, num_tokens)',
     'return num_tokens // block + min(num_experts, num_tokens) - 1',
     ROUTING_TEST),
    ("rank not counted from the expert's first query", ROUTING,
     'first_query = torch.cumsum(counts, 0) - counts',
     'first_query = torch.cumsum(counts, 0) * 0', ROUTING_TEST),
    ('blocks per expert rounded down', ROUTING,
     'blocks = torch.div(counts + block - 1, block, rounding_mode=',
     'blocks = torch.div(counts, block, rounding_mode=', ROUTING_TEST),
    ('one-hot rank (export) counted from 1', ROUTING,
     'rank = (onehot.cumsum(1) * onehot).sum(-1) - 1',
     'rank = (onehot.cumsum(1) * onehot).sum(-1)',
     ['tests/ops/test_export_backend.py']),
    ('layout size read on the host', ROUTING,
     'per_group = blocks_per_group(num_tokens, num_experts, block)',
     'per_group = int(torch.tensor(blocks_per_group(num_tokens, '
     'num_experts, block)))',
     ['tests/ops/test_torch_compile.py::'
      'test_forward_and_backward_without_host_sync']),
    ('GPU targets: graph run further than the tolerance from eager counted',
     TARGETS, "if e.get('rel_err_vs_eager', 0.0) > GRAPH_TOLERANCE:",
     'if False:', TARGETS_TEST),
    ('GPU targets: backend with a failed CUDA test counted', TARGETS,
     'if backend is not None and correct.get(backend) is False:',
     'if False:', TARGETS_TEST),
    ('GPU targets: encoder time ratio met when above the bound', TARGETS,
     'met=ratio <= bound', 'met=ratio >= bound', TARGETS_TEST),
    ('benchmark encoder: patch grid handed to attention as (W, H)',
     'mmseg_mita/bench/models.py',
     'attend_hw = functools.partial(attend, hw=hw)',
     'attend_hw = functools.partial(attend, hw=hw[::-1])',
     ['tests/bench/test_encoder.py']),
    ('compile=True compiling the training step with its optimizer again',
     'mmseg_mita/compat.py',
     "if target != 'train_step' or cfg is None or cfg is False:",
     'if True:', [COMPILE_TEST + 'test_compiled_training_equals_eager']),
    ('compile: the decode head left eager', COMPILE,
     "NOT_NETWORK = ('data_preprocessor', )",
     "NOT_NETWORK = ('data_preprocessor', 'decode_head')",
     [COMPILE_TEST + 'test_the_network_parts_are_compiled_not_the_data_'
      'preprocessor']),
    ('compile: an option torch.compile does not take accepted', COMPILE,
     '    if unknown:', '    if False:',
     [COMPILE_TEST + 'test_compile_options_of_the_config_value']),
    ('bench segmentor: the sliding window never set', SEGMENTOR,
     "    if workload.kind == 'slide':", '    if False:',
     [SEGMENTOR_TEST + 'test_sliding_window_runs_the_backbone_once_per_'
      'window']),
    ("bench segmentor: the optimizer's state left out of Mem", SEGMENTOR,
     'kept += [t for s in state for t in s.values()]', 'kept += []',
     [SEGMENTOR_TEST + 'test_memory_counts_the_weights_and_the_optimizer_'
      'state']),
    ('bench segmentor: fps over SDPA inverted', SEGMENTOR,
     "r['fps_vs_sdpa'] = r['fps'] / sdpa", "r['fps_vs_sdpa'] = sdpa / r['fps']",
     [SEGMENTOR_TEST + 'test_ratios_are_over_sdpa_and_over_eager']),
    ('bench: patch grid as (W, H)', 'mmseg_mita/bench/workloads.py',
     'return h, patches // h', 'return patches // h, h',
     ['tests/bench/test_workloads.py']),
    ('bench CLI: a common option added where not declared',
     'mmseg_mita/bench/cli.py', "if 'repeats' in common:", 'if True:',
     ['tests/bench/test_cli.py']),
    ('bench gpu suite: a part that did not pass not failing the suite',
     'mmseg_mita/bench/gpu.py',
     "return 0 if all(p[1] == 'pass' for p in suite.parts) else 1",
     'return 0', ['tests/bench/test_gpu.py::test_gpu_check_without_time_'
                  'records_skipped_parts']),
    ('Triton pooling bins end at floor (no overlap)', FUSED_POOLING,
     'return (bi * hgt // ph, ((bi + 1) * hgt + ph - 1) // ph,',
     'return (bi * hgt // ph, (bi + 1) * hgt // ph,', TRITON_TEST),
    ('Triton pooling backward: the next row bin sized as the first',
     FUSED_POOLING,
     '                size = rows1', '                size = rows0',
     TRITON_REF),
    ('Triton pooling backward: bins end at floor (no overlap)', FUSED_POOLING,
     'end = ((first + 1) * length + p - 1) // p',
     'end = (first + 1) * length // p', TRITON_REF),
    ('Triton routing argmax over the padding experts too', FUSED_KEYS,
     "scores = tl.where(l_mask[None, :], scores, -float('inf'))",
     'scores = scores', TRITON_TEST),
    ('Triton counting sort rank counts the query itself', FUSED_MERGE,
     'below = lanes - 1  # the lanes before each lane',
     'below = (lanes << 1) - 1', TRITON_TEST),
    ('Triton counting sort: free slots not advanced past a tile', FUSED_MERGE,
     'slot += tl.sum(counts, 0)', 'slot += 0', TRITON_SORT),
    ("Triton counting sort: a row's rank ignores the rows before it",
     FUSED_MERGE,
     'first = slot[None, :] + tl.cumsum(counts, 0) - counts',
     'first = slot[None, :] + counts - counts', TRITON_SORT),
    ('Triton counting sort: a clear bit matches any expert (no complement)',
     FUSED_MERGE, '                same &= tl.where(bit, ones, ~ones)',
     '                same &= tl.where(bit, ones, held)', TRITON_SORT),
    ("Triton counting sort: an expert's count tests bit 0 only", FUSED_MERGE,
     'per_expert &= tl.where(((experts >> b) & 1) != 0, ones,',
     'per_expert &= tl.where(((experts >> 0) & 1) != 0, ones,', TRITON_SORT),
    ('Triton popcount: the byte sums shifted by 23', FUSED_MERGE,
     'return (x * 0x01010101) >> 24', 'return (x * 0x01010101) >> 23',
     TRITON_SORT),
    ("Triton settings: an H200's SMs on every device", FUSED_SETTINGS,
     "    return utils.get_device_properties(device)['multiprocessor_count']",
     '    return 132',
     ['tests/ops/test_triton_compile.py::test_settings_follow_the_devices_sms']),
    ('Triton small tiles: 1 warp from 4 programs an SM', FUSED_SETTINGS,
     'return 1 if per_sm >= 8 else 2 if per_sm >= 4 else 4',
     'return 1 if per_sm >= 4 else 2 if per_sm >= 4 else 4',
     [TRITON_TEST_FILE +
      'test_small_tiles_take_fewer_warps_on_larger_grids']),
    ("Triton pooling's warps from its groups, not its programs",
     FUSED_SETTINGS,
     'pool=dict(num_warps=self._few_warps(groups * m),',
     'pool=dict(num_warps=self._few_warps(groups),',
     [TRITON_TEST_FILE +
      'test_small_tiles_take_fewer_warps_on_larger_grids']),
    ("Triton sort: 4 rows a tile whatever the merge's warps", FUSED_SETTINGS,
     "return self.options['merge']['num_warps'] if self.options else 2",
     'return 4 if self.options else 2',
     [TRITON_TEST_FILE +
      'test_small_tiles_take_fewer_warps_on_larger_grids']),
    ('Triton small tiles: 1 warp only above 8 programs an SM', FUSED_SETTINGS,
     'return 1 if per_sm >= 8 else 2 if per_sm >= 4 else 4',
     'return 1 if per_sm > 8 else 2 if per_sm >= 4 else 4',
     [TRITON_TEST_FILE +
      'test_small_tiles_take_fewer_warps_on_larger_grids']),
    ('Triton blocks per expert off by one (floor)', FUSED_MERGE,
     'return (counts + BLOCK - 1) // BLOCK', 'return counts // BLOCK',
     TRITON_TEST),
    ('Triton pooling backward into the extra tokens too', FUSED_POOLING,
     'is_patch = (patch >= 0) & (patch < hgt * wid) & (offs_t < n)',
     'is_patch = (patch < hgt * wid) & (offs_t < n)', TRITON_TEST),
    ('Triton pooling backward: a patch in the next bin along W always',
     FUSED_POOLING,
     '            if dj == 1:\n                held = held & two_cols',
     '            if dj == 1:\n                held = held', TRITON_REF),
    ('Triton pooling: bin columns indexed with the grid width', FUSED_POOLING,
     'bin_row = (offs_i.to(tl.uint32) // bin_wid.to(tl.uint32)).to(tl.int32)',
     'bin_row = (offs_i.to(tl.uint32) // wid.to(tl.uint32)).to(tl.int32)',
     TRITON_REF),
    ('Triton sort: offsets count the split itself as earlier', FUSED_MERGE,
     'earlier += tl.sum(tl.where((rows < split)[:, None], counts, 0), 0)',
     'earlier += tl.sum(tl.where((rows <= split)[:, None], counts, 0), 0)',
     TRITON_SORT),
    ("Triton sort: an expert's first block counts its own", FUSED_MERGE,
     'slot = (first_block + tl.cumsum(blocks, 0) - blocks) * BLOCK + earlier',
     'slot = (first_block + tl.cumsum(blocks, 0)) * BLOCK + earlier',
     TRITON_SORT),
    ('Triton routing: a later tile wins a tie', FUSED_KEYS,
     'wins = tile_top > top', 'wins = tile_top >= top', TRITON_ROUTING),
    ('Triton routing: ids outside [0, m) kept (no expert-0 rule)', FUSED_KEYS,
     'expert = tl.where((expert >= 0) & (expert < m), expert, 0)',
     'expert = expert', TRITON_ROUTED),
    ('Triton split merge: log-sum-exp without the splits\' max', FUSED_MERGE,
     'tl.store(LSE_R + row, top + tl.log2(total))',
     'tl.store(LSE_R + row, tl.log2(total))', TRITON_GPU_TILES),
    ('Triton split merge: the last split tile dropped', FUSED_MERGE,
     '        weight = tl.where(s_mask, weight, 0.0)\n        total += weight',
     '        weight = tl.where(s0 + BLOCK_S < splits, weight, 0.0)\n'
     '        total += weight', TRITON_GPU_TILES),
    ('Triton top-k: ties to the higher token', FUSED_TOPK,
     'keys = (bits.to(tl.int64) << 32) | (4294967295 - index.to(tl.int64))',
     'keys = (bits.to(tl.int64) << 32) | index.to(tl.int64)', TRITON_TOPK),
    ('Triton top-k: negative logits not reversed', FUSED_TOPK,
     'bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negatives: reversed',
     'bits = bits', TRITON_TOPK),
    ('Triton top-k: a compare-exchange keeps the larger first', FUSED_TOPK,
     'cube = tl.where((cube > partner) == first, partner, cube)',
     'cube = tl.where((cube > partner) != first, partner, cube)',
     TRITON_TOPK),
    ('Triton top-k: folded list left descending', FUSED_TOPK,
     'return tl.reshape(_bitonic(cube, DIMS, LOG_K, 0), best.shape)',
     'return tl.reshape(_bitonic(cube, DIMS, LOG_K, 1), best.shape)',
     TRITON_TOPK),
    ('Triton top-k: neighbouring runs not alternating', FUSED_TOPK,
     'cube = _bitonic(cube, DIMS, run, 2 if run < LOG_N else LAST)',
     'cube = _bitonic(cube, DIMS, run, 1)', TRITON_TOPK),
    ("Triton keys pass on sm_80 without its register cap (caught under "
     "triton 3.9, CI's)", FUSED_SETTINGS,
     "        if arch == 80:  # ptxas 12.9 (triton 3.9) held it at 168 and "
     "spilled\n            self.options['keys']['maxnreg'] = MAX_REGISTERS",
     '        if False:\n            pass',
     ['tests/ops/test_triton_compile.py::test_no_spills_or_gpu_scope_fences']),
    ('Triton chunk top-k: a split stores the chunks past its end', FUSED_KEYS,
     'mask=l_mask[:, None] & ((offs_c << LOG_C) < end)[None, :])',
     'mask=l_mask[:, None] & (offs_c < end)[None, :])', TRITON_CHUNKS),
    ('Triton chunk top-k: a group keyed by its minimum', FUSED_KEYS,
     '            top = tl.max(\n                tl.reshape(top,',
     '            top = tl.min(\n                tl.reshape(top,',
     TRITON_CHUNKS),
    ('Triton chunk top-k: ties between chunks (and groups) to the higher '
     'one', FUSED_TOPK,
     'return _fold_topk(best, _keyed(bits, index, valid), 0, LOG_K, LOG_K,',
     'return _fold_topk(best, _keyed(bits, 2**20 - index, valid), 0, LOG_K,'
     ' LOG_K,', TRITON_CHUNKS),
    ("Triton chunk top-k: the groups' last, partial tile skipped", FUSED_TOPK,
     '    if LOG_REST >= 0:\n        best = _fold_few(',
     '    if LOG_REST >= 9:\n        best = _fold_few(', TRITON_CHUNKS),
    ("Triton chunk top-k: the best groups' chunks not selected", FUSED_TOPK,
     '    if LOG_G > 0:  # their chunks', '    if LOG_G > 9:  # their chunks',
     TRITON_CHUNKS),
    ("Triton chunk top-k: a chunk's tokens indexed without its size",
     FUSED_TOPK, 'token = chunk * C + i', 'token = chunk + i', TRITON_CHUNKS),
    ('Triton merge: the warps of its programs with a fused top-k',
     FUSED_SETTINGS,
     '        if self.fused_topk:\n            return 1',
     '        if self.fused_topk:\n            return 4',
     [TRITON_TEST_FILE +
      'test_small_tiles_take_fewer_warps_on_larger_grids']),
    ('Triton experts backward: a program skips every other tile',
     FUSED_BACKWARD,
     'part, parts = tl.program_id(1), tl.num_programs(1)',
     'part, parts = tl.program_id(1), 2 * tl.num_programs(1)', TRITON_REF),
    ('Triton experts backward, dR added a tile: dR and dVt swapped',
     FUSED_BACKWARD,
     '_add_key_grads(DR, DVT, c_offs, c_mask, ds, p, q, do,',
     '_add_key_grads(DVT, DR, c_offs, c_mask, ds, p, q, do,',
     TRITON_GPU_TILES),
    ("Triton experts backward: dR of the program's last tile only",
     FUSED_BACKWARD,
     '        d_marks += _dot(', '        d_marks = _dot(', TRITON_REF),
    ("Triton experts backward: dVt of the program's last tile only",
     FUSED_BACKWARD,
     '        d_shared += _dot(', '        d_shared = _dot(', TRITON_REF),
    ('Triton experts backward: the compressed dq without dS R', FUSED_BACKWARD,
     '    return p, ds, _dot(_cast(ds, marks.dtype, UPCAST), marks, PRECISION,',
     '    return p, ds, 0.0 * _dot(_cast(ds, marks.dtype, UPCAST), marks,'
     ' PRECISION,', TRITON_REF),
    ('Triton experts backward: one program a group on a GPU', FUSED_SETTINGS,
     '        self.bwd_parts = min(tiles, 3 if arch is None else _cdiv(',
     '        self.bwd_parts = min(tiles, 3 if arch is None else 1 + 0 * _cdiv(',
     TRITON_WAVES),
    ("kernel model: the experts backward's tiles not shared out", MODEL,
     '    return _live_tiles(a) / a.grid[1]', '    return _live_tiles(a)',
     MODEL_TEST),
    ("kernel model: the experts backward's dR, dVt lanes all live", MODEL,
     '    return (tiles * a.k + a.m) / full * a.d / a.BLOCK_D',
     '    return (tiles * a.k + a.M_PAD) / full * a.d / a.BLOCK_D',
     MODEL_TEST),
    ('Triton top-k: the k smallest of the list written', FUSED_TOPK,
     'mask=offs_k >= K_PAD - k)', 'mask=offs_k < k)', TRITON_TOPK),
    ('TRITON_INTERPRET set after a test module imports triton',
     'tests/conftest.py', "    os.environ.setdefault('TRITON_INTERPRET', '1')",
     '    pass', [
         'tests/analysis/test_flops_variants.py',
         TRITON_TEST_FILE + 'test_kernels_run_in_the_interpreter_without_a_gpu'
     ]),
    ('Triton atomics acquire-release (the default sem)', FUSED_HELPERS,
     "tl.atomic_add(ptr, value, mask=mask, sem='relaxed')",
     'tl.atomic_add(ptr, value, mask=mask)',
     ['tests/ops/test_triton_compile.py::test_no_spills_or_gpu_scope_fences']),
    ('Triton registers: the experts kernels at head_dim 128 left to '
     "ptxas's cap (caught under triton 3.8 / 3.9, CI's)", FUSED_SETTINGS,
     'and self.block_d > 64:', 'and self.block_d > 128:',
     ['tests/ops/test_triton_compile.py::test_no_spills_or_gpu_scope_fences']),
    ('Triton registers: the backward at head_dim 128 on 64 queries a program '
     "(caught under triton 3.8 / 3.9, CI's)", FUSED_SETTINGS,
     '            self.block, 32)', '            self.block, 64)',
     ['tests/ops/test_triton_compile.py::test_no_spills_or_gpu_scope_fences']),
    ('Triton registers: the keys pass on sm_90 in two stages (caught under '
     "triton 3.9, CI's)", FUSED_SETTINGS, '90: (1, 3, 2, 2)}',
     '90: (2, 3, 2, 2)}',
     ['tests/ops/test_triton_compile.py::test_no_spills_or_gpu_scope_fences']),
    ('Triton keys pass: one split for any N (no waves)', FUSED_SETTINGS,
     'programs = 8 if arch is None else 2 * sms',
     'programs = 1', TRITON_WAVES),
    ('Triton keys pass: 16 landmarks a tile on sm_90 too', FUSED_SETTINGS,
     'self.keys_l = min(self.m_pad, 64) if wide else 16',
     'self.keys_l = 16', TRITON_KEYS_TILE),
    ('Triton keys pass: 64 landmark rows a tile whatever m', FUSED_SETTINGS,
     'self.keys_l = min(self.m_pad, 64) if wide else 16',
     'self.keys_l = 64 if wide else 16', TRITON_KEYS_TILE),
    ('Triton keys pass: every landmark a tile at head_dim 128 too',
     FUSED_SETTINGS, 'self.block_d <= 64 and self.log_c > 0)',
     'self.block_d <= 128 and self.log_c > 0)', TRITON_KEYS_TILE),
    ('Triton keys pass: every landmark a tile with chunks of one token too',
     FUSED_SETTINGS, 'self.block_d <= 64 and self.log_c > 0)',
     'self.block_d <= 64)', TRITON_KEYS_TILE),
    ('Triton experts forward: one stage whatever the trips', FUSED_SETTINGS,
     'if dtype != torch.float32 and max(m, self.k) <= self.block_n:',
     'if dtype != torch.float32:', TRITON_FWD_STAGES),
    ('Triton experts forward: the routed keys\' trips left out of its stages',
     FUSED_SETTINGS, 'max(m, self.k) <= self.block_n:',
     'm <= self.block_n:', TRITON_FWD_STAGES),
    ('Triton experts forward: the stages of one trip off by one tile',
     FUSED_SETTINGS, 'max(m, self.k) <= self.block_n:',
     'max(m, self.k) < self.block_n:', TRITON_FWD_STAGES),
    ('Triton experts forward: one stage in float32 too', FUSED_SETTINGS,
     'if dtype != torch.float32 and max(m, self.k) <= self.block_n:',
     'if max(m, self.k) <= self.block_n:', TRITON_FWD_STAGES),
    ('Triton experts forward: one stage in ptxas\'s registers', FUSED_SETTINGS,
     "update(num_stages=1,\n                                               "
     "maxnreg=MAX_REGISTERS)", "update(num_stages=1)", TRITON_FWD_STAGES),
    ('Triton logits: one 64-row product (a wgmma) in the keys pass',
     FUSED_TOPK, '    if L == 16:\n', '    if L >= 16:\n',
     ['tests/ops/test_triton_compile.py::'
      'test_logits_are_16_row_products_in_both_passes']),
    ("Triton merge: recomputes the logits on the shared backward's tiles",
     FUSED_CUSTOM_OPS, 'LOG_REST=cfg.log_rest, LOG_L=_log2(cfg.keys_l),',
     'LOG_REST=cfg.log_rest, LOG_L=_log2(cfg.block_l),',
     ['tests/ops/test_triton_compile.py::'
      'test_merge_recomputes_logits_with_the_keys_pass_product']),
    ('Triton float32 dots on tf32', FUSED_SETTINGS,
     "self.precision = 'ieee' if dtype == torch.float32 else 'tf32'",
     "self.precision = 'tf32'", TRITON_TEST),
    ('Triton declared to take head_dim up to 127 only', FUSED_CUSTOM_OPS,
     'max_head_dim=128, max_experts_per_query=1,',
     'max_head_dim=127, max_experts_per_query=1,', TRITON_TEST),
    ('SASS: GPU-scope fences not counted', SASS,
     "if parts[0] == 'MEMBAR' and set(parts[1:]) & {'GPU', 'SYS', 'GL'}:",
     "if parts[0] == 'MEMBAR' and set(parts[1:]) & {'SYS', 'GL'}:",
     SASS_TEST),
    ('SASS: sm_90 relaxed atomics (REDG) not counted', SASS,
     "GLOBAL_ATOMICS = ('ATOMG', 'ATOM', 'RED', 'REDG')",
     "GLOBAL_ATOMICS = ('ATOMG', 'ATOM', 'RED')", SASS_TEST),
    ('SASS: spill stores counted 4 bytes whatever their width', SASS,
     "counts['spill_store_bytes'] += _width(parts[1:])",
     "counts['spill_store_bytes'] += 4", SASS_TEST),
    ('SASS: an HGMMA counted for each warp of its warpgroup', SASS,
     'return kind, m * n * k // 4  # one warpgroup = 4 warps',
     'return kind, m * n * k', SASS_TEST),
    ('occupancy: registers not rounded up to their allocation unit',
     HARDWARE, 'return max(1, -(-registers * 32 // facts.register_unit)) * \\',
     'return max(1, registers * 32 / facts.register_unit) * \\',
     HARDWARE_TEST),
    ('occupancy: no shared memory kept by the system per block', HARDWARE,
     '(shared + facts.smem_reserved_per_block))', '(shared + 0))',
     HARDWARE_TEST),
    ('kernel model: loop trip counts ignored', MODEL,
     "weight = math.prod(trips[i] for i in region['loops'])", 'weight = 1',
     MODEL_TEST),
    ('kernel model: fences charged per program, not per round of resident '
     'blocks', MODEL, 'rounds = cdiv(per_sm, resident)',
     'rounds = cdiv(per_sm, 1)', MODEL_TEST),
    ('kernel model: a one-warp program issues on every scheduler', MODEL,
     "                 rounds * work['instructions']) + (",
     '                 0) + (', MODEL_TEST),
    ('kernel model: full bandwidth below one wave', MODEL,
     'busy = min(programs, part.sms) / part.sms', 'busy = 1', MODEL_TEST),
    ('kernel model: masked atomic lanes charged (padding head dims)', MODEL,
     'return (sum(rows) / sum(cdiv(r, tile) * tile for r in rows) * a.d /',
     'return (sum(rows) / sum(cdiv(r, tile) * tile for r in rows) * 1 /',
     MODEL_TEST),
    ('kernel model: the live share of atomics ignored', MODEL,
     "share = model.atomic_share(args) if model.atomic_share else 1.0",
     'share = 1.0', MODEL_TEST),
    ('Triton experts: a program whose first slot is token 0 skipped',
     FUSED_HELPERS,
     'expert = tl.where(tl.load(first) < 0, -1, expert)',
     'expert = tl.where(tl.load(first) <= 0, -1, expert)', TRITON_REF),
    ('Triton experts forward: 64 queries a program whatever the block',
     FUSED_SETTINGS, 'self.block_m = min(self.block, largest)',
     'self.block_m = largest', TRITON_GPU_TILES),
    ('kernel model: attention backward without recomputing P', MODEL,
     'backward=(8 * per_tensor + lse, 2.5 * flops)',
     'backward=(8 * per_tensor + lse, 2 * flops)', MODEL_TEST),
    ('kernel model: attention backward reads no o nor dO', MODEL,
     'backward=(8 * per_tensor + lse, 2.5 * flops)',
     'backward=(6 * per_tensor + lse, 2.5 * flops)', MODEL_TEST),
    ("AOT compile: triton's shared-memory check not restored",
     'mmseg_mita/bench/triton_aot.py',
     '            compiler.max_shared_mem = saved_limit\n', '',
     ['tests/ops/test_triton_compile.py::test_compiling_restores_triton']),
    ('wheel without the configs\' sub-folders', 'setup.py',
     "['.mim/configs/**/*.py', '.mim/configs/**/*.md',",
     "['.mim/configs/*/*.py', '.mim/configs/**/*.md',", PACKAGING_TEST),
    ('a torch minimum above the installed torch', 'setup.py',
     "'torch>=2.6',", "'torch>=2.14',", PACKAGING_TEST),
    ('wheel version not read from mmseg_mita/version.py', 'setup.py',
     'version=version(),', "version='0.1.0',", PACKAGING_TEST),
    ('the tools\' config argument never looked up by name',
     'mmseg_mita/tools.py', '        argv[0] = resolve_config(argv[0])',
     '        pass', PACKAGING_TEST),
    ('config names listed with the other files of the folder',
     'mmseg_mita/config_files.py',
     "for f in os.listdir(LEAF_DIR) if f.endswith('.py'))",
     'for f in os.listdir(LEAF_DIR))', CONFIG_TEST),
    ('a missing path looked up as a config name', 'mmseg_mita/tools.py',
     'if osp.isfile(arg) or osp.dirname(arg):', 'if osp.isfile(arg):',
     CONFIG_TEST),
    ('compile allowed on a torch that compiles MiTA wrong', COMPILE,
     '    if torch.__version__ < COMPILE_MIN_TORCH:', '    if False:',
     [COMPILE_TEST + 'test_compile_needs_its_minimum_torch']),
    ('bench segmentor configs not looked up among the packaged ones',
     'mmseg_mita/bench/segmentors.py', '    full = resolve_config(path)',
     '    full = path', ['tests/bench/test_workloads.py']),
    ('bench onnx configs not looked up among the packaged ones',
     'mmseg_mita/bench/onnx_runtime.py',
     'model = build_segmentor(resolve_config(config))',
     'model = build_segmentor(config)', ['tests/bench/test_onnx.py']),
]


def run_tests(clone, tests):
    return subprocess.run([
        sys.executable, '-m', 'pytest', '-q', '-x', '-p', 'no:warnings', '-p',
        'no:cacheprovider', *tests
    ],
                          cwd=clone,
                          capture_output=True,
                          text=True)


def main(argv=None):
    words = [w.lower() for w in (sys.argv[1:] if argv is None else argv)]
    chosen = [m for m in MUTATIONS
              if not words or any(w in m[0].lower() for w in words)]
    if not chosen:
        sys.exit(f'no mutation name contains any of {words}')
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        clone = osp.join(tmp, 'clone')
        subprocess.run(['git', 'clone', '-q', REPO, clone], check=True)
        for name, path, old, new, tests in chosen:
            target = osp.join(clone, path)
            with open(target) as f:
                source = f.read()
            if source.count(old) != 1:
                sys.exit(f'{name}: {old!r} is not in {path} exactly once; '
                         'update the mutation to the code')
            with open(target, 'w') as f:
                f.write(source.replace(old, new))
            try:
                result = run_tests(clone, tests)
            finally:
                with open(target, 'w') as f:
                    f.write(source)
            lines = result.stdout.strip().splitlines() or ['(no output)']
            failed = [line for line in lines if line.startswith('FAILED')]
            if result.returncode == 0:
                missed += 1
                print(f'MISSED  {name}: {lines[-1]}', flush=True)
            else:
                print(f'CAUGHT  {name}: {(failed or lines)[0]}', flush=True)
    sys.exit(1 if missed else 0)


if __name__ == '__main__':
    main()
