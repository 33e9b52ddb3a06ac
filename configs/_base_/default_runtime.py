# mmseg's runtime, with the plugin imported wherever the config is used
# (mmseg's own tools/train.py and tools/test.py included).
_base_ = 'mmseg::_base_/default_runtime.py'
custom_imports = dict(
    imports=['mmseg_mita.mmseg_plugin'], allow_failed_imports=False)
