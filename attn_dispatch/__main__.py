"""``python -m attn_dispatch`` is the ``attn-dispatch`` command."""

import sys

from .tools.cli import main

sys.exit(main())
