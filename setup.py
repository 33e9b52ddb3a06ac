from setuptools import find_packages, setup

setup(
    name='mmseg_mita',
    version='0.1.0',
    description='MiTA attention (mixture of top-k activations) for '
    'semantic segmentation in mmsegmentation',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmseg_mita', 'mmseg_mita.*']),
    python_requires='>=3.8',
    install_requires=[
        # Bring your own build (CUDA or CPU); scripts/setup.sh installs a
        # CPU build where none is present.
        'torch>=2.0',
        'mmengine>=0.10.0,<0.11',
        # mmseg 1.2.2 imports mmcv.ops (compiled) and asserts mmcv < 2.2.0.
        'mmcv==2.1.0',
        'mmsegmentation==1.2.2',
        # imported by mmseg without being declared
        'ftfy',
        'regex',
        # mmseg 1.2.2 / mmcv 2.1.0 predate numpy 2
        'numpy<2',
        # mmengine's config lookup ('mmseg::') and mmcv's build need
        # pkg_resources, gone in setuptools 81
        'setuptools<81',
    ],
    extras_require={
        'flash': ['flash-attn>=2.5'],
        'tests': ['pytest', 'triton'],
        # tools/export_onnx.py; tested with onnx 1.23.2, onnxruntime
        # 1.32.0 and numpy 1.26
        'deploy': ['onnx>=1.23', 'onnxruntime>=1.32'],
    },
)
