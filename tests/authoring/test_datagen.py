"""polygym.authoring.datagen: the command line every data/generate.py shares, and the bytes it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from polygym.authoring.datagen import generator_main, generator_parser, per_split, write_splits
from polygym.jsonl import write_jsonl

SPLITS = ["example", "train", "validation"]


def rows(split: str) -> list[dict]:
    return [{"split": split, "text": "café ü"}]


def run(tmp_path: Path, *argv: str) -> tuple[list[str], dict[str, str]]:
    """Run a generator over SPLITS with ``argv``; (splits it built, {file name: text} under tmp_path)."""
    built: list[str] = []

    def build(split: str) -> list[dict]:
        built.append(split)
        return rows(split)

    generator_main(per_split(build), SPLITS, tmp_path / "data", __doc__, list(argv))
    written = {str(p.relative_to(tmp_path)): p.read_text(encoding="utf-8") for p in tmp_path.rglob("*.jsonl")}
    return built, written


def test_readable_jsonl_keeps_non_ascii_and_default_separators(tmp_path: Path) -> None:
    path = tmp_path / "new" / "rows.jsonl"
    assert write_jsonl([{"a": 1, "b": "é"}, {"c": [1, 2]}], path, readable=True) == 2
    assert path.read_bytes() == '{"a": 1, "b": "é"}\n{"c": [1, 2]}\n'.encode()


def test_each_written_split_is_reported(tmp_path: Path, capsys) -> None:
    run(tmp_path, "--split", "train")
    assert capsys.readouterr().out == f"wrote 1 rows to {tmp_path / 'data' / 'train.jsonl'}\n"


def test_no_flags_write_every_split_next_to_the_script(tmp_path: Path) -> None:
    built, written = run(tmp_path)
    assert built == SPLITS
    assert sorted(written) == [f"data/{s}.jsonl" for s in sorted(SPLITS)]
    assert written["data/train.jsonl"] == '{"split": "train", "text": "café ü"}\n'


@pytest.mark.parametrize(
    ("argv", "expected_built", "expected_files"),
    [
        (["--split", "train"], ["train"], ["data/train.jsonl"]),
        (["--output-dir", "{tmp}/out"], SPLITS, [f"out/{s}.jsonl" for s in sorted(SPLITS)]),
        (["--output", "{tmp}/one.jsonl"], ["example"], ["one.jsonl"]),
        (["--split", "validation", "--output", "{tmp}/one.jsonl"], ["validation"], ["one.jsonl"]),
    ],
    ids=["split", "output-dir", "output", "split-output"],
)
def test_flags_choose_splits_and_places(tmp_path, argv, expected_built, expected_files) -> None:
    built, written = run(tmp_path, *(a.format(tmp=tmp_path) for a in argv))
    assert built == expected_built
    assert sorted(written) == expected_files


def test_one_split_generators_take_no_split_flag(tmp_path: Path) -> None:
    parser = generator_parser("Write one file.", ["example"], tmp_path)
    with pytest.raises(SystemExit):
        parser.parse_args(["--split", "example"])
    write_splits(parser.parse_args([]), ["example"], lambda wanted: {"example": rows("example")})
    assert (tmp_path / "example.jsonl").exists()


def test_unknown_split_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        run(tmp_path, "--split", "test")
