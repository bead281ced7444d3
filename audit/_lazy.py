"""Public names of a package that live in its modules, each module imported when one of its names is first read.

A package's `__init__.py` declares `{name: module}` and hands it to `exports`: `import audit` (or a family such as
`audit.fidel`) then costs nothing, and a name that needs torch imports torch only when it is read, so that reading a
plan stays torch-free. Nothing else is loaded behind the caller's back: an unknown name is an AttributeError.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

__all__ = ["exports"]


def exports(package: dict, names: Mapping[str, str], modules: Mapping[str, str] | None = None
            ) -> tuple[list[str], Callable[[str], Any], Callable[[], list]]:
    """(`__all__`, `__getattr__`, `__dir__`) for the package whose globals are `package`: `names` maps each public name
    to the module that defines it ("module:name" where the module calls it otherwise), `modules` each public name that
    is a module itself (a namespace such as `audit.readings`) to that module. A name read once is kept in the
    package's globals."""
    modules = dict(modules or {})
    clash = set(names) & set(modules)
    if clash:
        raise ValueError(f"{package['__name__']}: {sorted(clash)} exported twice")

    def __getattr__(name: str) -> Any:
        if name in modules:
            value = importlib.import_module(modules[name])
        elif name in names:
            module, _, own = names[name].partition(":")
            value = getattr(importlib.import_module(module), own or name)
        else:
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        package[name] = value
        return value

    def __dir__() -> list:
        return sorted({*package, *names, *modules})

    return [*names, *modules], __getattr__, __dir__
