"""Deprecated: moved to ``attn_dispatch.tools.bench``; this name still resolves to that module,
with a ``DeprecationWarning``, for one release."""

import sys
import warnings

from .tools import bench as _moved

warnings.warn(
    "attn_dispatch.bench is deprecated and will be removed in the next release; "
    "use attn_dispatch.tools.bench",
    DeprecationWarning,
    stacklevel=2,
)
if __name__ == "__main__":
    sys.exit(_moved.main())
# The old name is the module itself, not a copy: what is set on one is seen through the other.
sys.modules[__name__] = _moved
