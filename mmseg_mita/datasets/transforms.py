"""Data pipeline checks."""
import numpy as np
from mmcv.transforms import BaseTransform
from mmseg.registry import TRANSFORMS

from mmseg_mita.utils import check_int


@TRANSFORMS.register_module()
class CheckSegMap(BaseTransform):
    """Fail clearly on an annotation that does not fit its image or dataset.

    Place it right after ``LoadAnnotations``, before any transform that
    resizes or crops the annotation; without an annotation (inference
    pipelines drop ``LoadAnnotations``) it does nothing. It raises
    ``ValueError`` naming both files when the annotation is not a
    single-channel map of the image's (original) size, or when it holds
    labels other than ``0..num_classes - 1`` and ``ignore_index`` (after
    ``reduce_zero_label`` and ``label_map``, as the loss sees them). Either
    would otherwise train on misaligned labels, or crash the loss (CPU) or
    trigger a device-side assert (CUDA) far from the cause.

    Args:
        num_classes (int): the classes of the dataset.
        ignore_index (int): the label the loss ignores. Defaults to 255.
    """

    def __init__(self, num_classes: int, ignore_index: int = 255):
        self.num_classes = check_int(num_classes, 'num_classes')
        self.ignore_index = ignore_index

    def transform(self, results: dict) -> dict:
        seg = results.get('gt_seg_map')
        if seg is None:
            return results
        img_hw = tuple(results['ori_shape'])
        files = (f"annotation {results.get('seg_map_path')} (image "
                 f"{results.get('img_path')})")
        if seg.shape != img_hw:
            raise ValueError(
                f'{files}: the annotation has shape {seg.shape} but the '
                f'image is {img_hw[0]}x{img_hw[1]}; annotations must be '
                'single-channel class-index maps of their image\'s size')
        values = np.unique(seg)
        bad = values[(values >= self.num_classes)
                     & (values != self.ignore_index)]
        if bad.size:
            stored = ''
            if results.get('reduce_zero_label'):
                stored = (f' (stored in the file as {(bad + 1).tolist()}: '
                          'reduce_zero_label=True subtracts 1)')
            raise ValueError(
                f'{files}: label values {bad.tolist()}{stored} are outside '
                f'0..{self.num_classes - 1} (num_classes={self.num_classes}) '
                f'and not the ignore index {self.ignore_index}; fix the '
                'annotation, or num_classes / reduce_zero_label / '
                'ignore_index of the config')
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_classes={self.num_classes}, '
                f'ignore_index={self.ignore_index})')
