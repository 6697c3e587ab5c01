"""Command-line tools on top of the public API: the ``attn-dispatch`` command (``cli``) and
its benchmark harness (``bench``), with the argument parsing they share (``_args``).

The core never imports this package: a library call loads none of it.
"""
