from .backbones import *  # noqa: F401,F403
from .decode_heads import *  # noqa: F401,F403
