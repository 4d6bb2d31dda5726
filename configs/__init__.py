"""Experiment configs: Python files whose ``get_config(variant)`` returns an ``ml_collections.ConfigDict``.

Every config starts from :func:`configs.base.get_config` (every key
commented there) and changes what differs; variants (``file.py:pe=shaw,k=4``)
are parsed by :func:`configs.base.parse_variant`, the one parser. Run from the
repository root, as ``python run.py --config=configs/<name>.py[:variant]``.
"""
