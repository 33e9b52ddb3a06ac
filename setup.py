import os.path as osp

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))


def read(*parts):
    with open(osp.join(ROOT, *parts), encoding='utf-8') as f:
        return f.read()


def version():
    """``__version__`` of mmseg_mita/version.py (without importing the
    package, which needs torch)."""
    namespace = {}
    exec(read('mmseg_mita', 'version.py'), namespace)
    return namespace['__version__']


setup(
    name='mmseg_mita',
    version=version(),
    description='MiTA attention (mixture of top-k activations) for '
    'semantic segmentation in mmsegmentation',
    long_description=read('README.md'),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmseg_mita', 'mmseg_mita.*']),
    # configs/ (mmseg_mita/.mim/configs links to it): config_path(name)
    package_data={
        'mmseg_mita':
        ['.mim/configs/**/*.py', '.mim/configs/**/*.md',
         '.mim/configs/**/*.yaml']
    },
    # torch 2.13 has wheels for 3.10 and newer; runs tested on 3.11
    python_requires='>=3.10',
    install_requires=[
        # Bring your own build (CUDA or CPU); scripts/setup.sh installs a
        # CPU build where none is present. 2.6: the checkpoint loader
        # (mmseg_mita/safe_load) passes (object, name) pairs to
        # torch.serialization.safe_globals; on 2.6.0 it refuses every
        # crafted file of the tests. The operator alone needs 2.4; the
        # triton backend triton >= 3.3; compile=True torch 2.13 (refused
        # below). The whole suite: 2.13.0. What ran where: docs/install.md.
        'torch>=2.6',
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
        # triton: the kernels' interpreter tests and their compiles for
        # sm_80/89/90, checked spill-free under triton 3.6 to 3.9 (a new
        # release's ptxas allocates registers anew: check it, then lift)
        'tests': ['pytest', 'triton>=3.6,<3.10'],
        # tools/export_onnx.py; tested with onnx 1.23.2, onnxruntime
        # 1.32.0 and numpy 1.26
        'deploy': ['onnx>=1.23', 'onnxruntime>=1.32'],
    },
    classifiers=[
        'Programming Language :: Python :: 3',
        'Operating System :: POSIX :: Linux',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
        'Topic :: Scientific/Engineering :: Image Recognition',
    ],
    zip_safe=False,
)
