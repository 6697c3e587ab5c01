"""Adapters that plug ``attn_dispatch.attention`` into model libraries.

Each submodule imports its library itself; importing this package imports none of them.
"""
