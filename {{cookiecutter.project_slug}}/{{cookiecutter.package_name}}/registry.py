"""Components by name (DATASETS, MODELS, TASKS), each imported when first looked up: a run
loads the dataset, model and task it names, not every one the project has.

An entry is `name=".module:Class"` (the module relative to the registry's package), or the
class itself (`registry["name"] = Class` too). Listing names, or `name in registry`, imports
nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, MutableMapping


class Registry(MutableMapping):
    def __init__(self, package: str, **entries):
        self._package, self._entries = package, entries

    def __getitem__(self, name: str):
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module, self._package), attr)
            self._entries[name] = entry
        return entry

    def module(self, name: str) -> str:
        """The module `name`'s component lives in, found without importing it."""
        entry = self._entries[name]
        if isinstance(entry, str):
            return importlib.util.resolve_name(entry.partition(":")[0], self._package)
        return entry.__module__

    def __setitem__(self, name: str, component) -> None:
        self._entries[name] = component

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
