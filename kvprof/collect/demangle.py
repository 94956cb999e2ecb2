"""C++ symbol names as people read them: `_ZNK5Table11fingerprintEm.isra.0` is
`Table::fingerprint(unsigned long) const [clone .isra.0]`.

The demangler is the C++ runtime's own, `abi::__cxa_demangle` of libstdc++ (what
c++filt and gdb print): it keeps a compiler's clone suffix (`.isra.0`,
`.constprop.0`, `.part.0`, `.cold`) as a `[clone ...]` note. A name it does not
know (a C name, or no libstdc++ on the machine) is shown as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _runtime() -> tuple[Any, Any] | None:
    """libstdc++'s __cxa_demangle and libc's free, None when libstdc++ cannot be loaded."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6").__cxa_demangle
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    free.argtypes = [ctypes.c_void_p]
    return fn, free


@functools.lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str:
    """`name` demangled when it is a mangled C++ name (`_Z...`), else `name`."""
    if not name.startswith("_Z"):
        return name
    runtime = _runtime()
    if runtime is None:
        return name
    fn, free = runtime
    status = ctypes.c_int()
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if not out:
        return name
    try:
        text = ctypes.string_at(out).decode(errors="replace")
    finally:
        free(out)
    return text if status.value == 0 and text else name
