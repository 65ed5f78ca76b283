"""recovery.fsutil.read_json: the one reading of the toolkit's JSON state files (where a
daemon listens, the pids a start recorded): missing is None, anything else wrong is one error
naming the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from recovery.errors import ClusterError, RecoverError
from recovery.fsutil import read_json


def endpoint(raw: Any) -> tuple[str, int]:
    return str(raw["url"]), int(raw["pid"])


def test_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_json(tmp_path / "coordinator.json", endpoint) is None
    assert read_json(tmp_path / "no-such-dir" / "x.json", endpoint) is None


def test_a_good_file_is_what_parse_makes_of_it(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.json"
    path.write_text('{"url": "http://127.0.0.1:8470", "pid": 42}\n')
    assert read_json(path, endpoint) == ("http://127.0.0.1:8470", 42)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", r"not JSON \(Expecting value"),
        ('{"url": "http://x", "pid": 4', r"not JSON \("),
        ('{"url": "http://x"}', r"no field 'pid' in it"),
        ('{"url": "http://x", "pid": "forty"}', r"unexpected content \(invalid literal"),
        ('["http://x", 42]', r"unexpected content \("),
    ],
    ids=["empty", "torn", "field missing", "wrong type", "wrong shape"],
)
def test_a_damaged_file_is_one_error_naming_it(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "coordinator.json"
    path.write_text(content)
    with pytest.raises(RecoverError, match=f"^cannot read {re.escape(str(path))}: {why}"):
        read_json(path, endpoint)


def test_an_unreadable_file_is_the_same_error(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.mkdir()  # a directory where the file should be: read_text raises IsADirectoryError
    with pytest.raises(RecoverError, match=f"^cannot read {re.escape(str(path))}: .*directory"):
        read_json(path, endpoint)


def test_the_caller_chooses_the_error_class(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text("{")
    with pytest.raises(ClusterError) as e:
        read_json(path, endpoint, error=ClusterError)
    assert e.value.exit_code == ClusterError.exit_code
    assert isinstance(e.value.__cause__, ValueError)
