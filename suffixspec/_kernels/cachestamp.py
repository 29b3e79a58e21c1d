"""Cache keys of the kernels: one digest of every kernel module's source.

Numba keys a cached kernel by its own file, but kernels inline functions of other kernel modules
(`inline="always"`: `propose.propose_framed` holds `draft.expand`, which holds `learn` and `lct`
code). After an edit of one module (a `git pull` or a checkout of an editable install), another
module's cached machine code would still hold the old inlined code, reading and writing arrays
by an old layout (seen: heap corruption after `draft.py` changed under a cached `propose.py`).
`install()` puts locators in front of numba's own that, for the files of this package only, stamp
every cache entry with the digest of all of them, so that a change of any kernel module compiles
every kernel afresh. Cache locations stay numba's (`NUMBA_CACHE_DIR`, else `__pycache__`, else the
user-wide directory); other code's caches are untouched. With `NUMBA_CACHE_LOCATOR_CLASSES` set,
or a numba without these hooks, numba's own keys apply.
"""

from __future__ import annotations

import functools
import hashlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=1)
def digest() -> str:
    """sha256 over the names and contents of this package's modules."""
    h = hashlib.sha256()
    for name in sorted(n for n in os.listdir(HERE) if n.endswith(".py")):
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


class _KernelStamp:
    """Locator mixin: only files of this package; their stamp is the package digest."""

    suffixspec_kernels = True

    def get_source_stamp(self):
        return "suffixspec-kernels:" + digest()

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.dirname(os.path.abspath(py_file)) != HERE:
            return None
        return super().from_function(py_func, py_file)


def install() -> bool:
    """Put the package's locators first (once); False when numba has no such hook."""
    try:
        from numba.core import caching

        impl = caching.CacheImpl
        bases = [caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator]
    except (ImportError, AttributeError):
        return False
    if any(getattr(c, "suffixspec_kernels", False) for c in impl._locator_classes):
        return True
    mine = [type("Kernel" + b.__name__, (_KernelStamp, b), {}) for b in bases]
    impl._locator_classes[:0] = mine
    return True
