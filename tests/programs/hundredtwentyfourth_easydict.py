"""The EasyDict that the hundredtwentyfourth-* runs' configs import (linked into each run's folder
as easydict.py): arcface_torch's configs are `config = edict()` modules, and easydict is not
installed here. A dict whose keys are also attributes, as easydict.EasyDict is."""

from __future__ import annotations


class EasyDict(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value
