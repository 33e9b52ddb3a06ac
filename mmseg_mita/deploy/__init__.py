"""Deployment: ONNX export of segmentors (MiTA or full attention) and the
check of the exported file in ONNX Runtime (``tools/export_onnx.py``)."""
from .onnx_export import (SegmentorLogits, build_segmentor, compare_logits,
                          export_onnx, prepare_for_export, run_onnxruntime,
                          torch_logits, within_tolerance)

__all__ = [
    'SegmentorLogits', 'build_segmentor', 'compare_logits', 'export_onnx',
    'prepare_for_export', 'run_onnxruntime', 'torch_logits',
    'within_tolerance'
]
