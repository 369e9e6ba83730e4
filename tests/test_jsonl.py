"""polygym.jsonl: strict reading of user files, tolerant reading of files polygym appends to."""

from pathlib import Path

import pytest

from polygym.jsonl import (
    JsonlAppender,
    count_rows,
    encode_jsonl,
    iter_jsonl,
    numbered_lines,
    read_jsonl,
    truncate_torn_tail,
    write_jsonl,
)


def test_user_files_skip_blank_lines_and_name_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n  \n[2]\n')
    assert [n for n, _ in numbered_lines(path)] == [1, 4]
    assert read_jsonl(path) == [{"a": 1}, [2]]
    assert count_rows(path) == 2
    path.write_bytes(b'{"a": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: invalid JSON"):
        read_jsonl(path)


def test_appended_files_give_complete_objects_only(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    assert list(iter_jsonl(path)) == []  # not written yet
    path.write_bytes(b'{"a": 1}\nnot json\n[1]\n{"b": 2}\n{"torn": ')
    assert list(iter_jsonl(path)) == [{"a": 1}, {"b": 2}]
    truncate_torn_tail(path)
    assert path.read_bytes().endswith(b'{"b": 2}\n')


def test_appender_flushes_every_write(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")  # token ids and log-probs may come as numpy arrays
    path = tmp_path / "out.jsonl"
    with JsonlAppender(path) as out:
        out.write({"ids": np.array([1, 2])})
        assert path.read_bytes() == b'{"ids":[1,2]}\n'  # on disk before the file is closed
        out.write_all([{"a": 1}, {"b": 2}])
        assert count_rows(path) == 3


def test_write_replaces_and_matches_the_encoding(tmp_path: Path) -> None:
    path = tmp_path / "new" / "rows.jsonl"
    rows = [{"a": 1}, {"é": [1.5, None]}]
    write_jsonl([{"old": True}], path)
    assert write_jsonl(iter(rows), path) == 2
    assert path.read_bytes() == encode_jsonl(rows) and read_jsonl(path) == rows
