"""Which SGLang versions the plug-in and the SGLang-profile daemon run with.

Supported: 0.5.17 (the GPU machine's SGLang, on torch 2.11) to 0.5.21 (the newest SGLang built for
this project's torch 2.13); CI runs the SGLang tests on both ends (Makefile: test-sglang,
test-sglang-oldest). The two differ in how ``ServerArgs`` resolve, how a process publishes its rank
and sizes, and the order in which ``get_model_loader`` looks at a loader class; the modules that
touch those key a branch on the fact itself (build.py, server_args.py, plugin.py). The loader reaches
into SGLang's model construction, runtime context and post-processing, which change between patch
releases without notice, so anything outside the range is refused when SGLang loads the plug-in or
the daemon imports SGLang, before a model is built.
"""

from __future__ import annotations

import re

from weightcache_contract.errors import WeightCacheError

OLDEST = (0, 5, 17)
NEWEST = (0, 5, 21)


def release(version: str) -> tuple[int, int, int]:
    """``0.5.21`` → (0, 5, 21); a local part (``+cpu``) does not change the APIs used."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        raise WeightCacheError(f"cannot read SGLang's version {version!r}; weightcache supports SGLang {supported()}")
    return int(match[1]), int(match[2]), int(match[3])


def supported() -> str:
    oldest, newest = (".".join(map(str, v)) for v in (OLDEST, NEWEST))
    return oldest if oldest == newest else f"{oldest} to {newest}"


def check(version: str) -> None:
    """Refuse an SGLang outside the supported range, naming the range and the fix."""
    if not OLDEST <= release(version) <= NEWEST:
        raise WeightCacheError(
            f"weightcache's SGLang plug-in supports SGLang {supported()}, and this is SGLang {version}; install a "
            "supported SGLang in the engine's and the daemon's image, or serve with --load-format auto "
            "(from disk, without the cache)"
        )
