"""Names are limited in UTF-8 bytes, the unit filesystems and key stores count (issue 20)."""

from __future__ import annotations

import pytest

from danube.values.errors import DanubeError
from danube.values.names import parse_topic, partition_names, validate_namespace


def test_a_topic_name_is_limited_in_bytes_not_characters() -> None:
    parse_topic("/default/" + "é" * 123)  # 255 bytes
    with pytest.raises(DanubeError, match="255 bytes"):
        parse_topic("/default/" + "é" * 124)  # 133 characters, 257 bytes
    with pytest.raises(DanubeError, match="409 bytes"):
        parse_topic("/default/" + "é" * 200)


def test_a_namespace_is_limited_in_bytes() -> None:
    validate_namespace("é" * 127)
    with pytest.raises(DanubeError, match="bytes"):
        validate_namespace("é" * 128)


def test_partitions_suffixes_count_before_anything_is_created() -> None:
    base = "/default/" + "a" * 239  # 248 bytes: "-part-9" fits, "-part-10" does not
    assert len(partition_names(base, 10)) == 10
    with pytest.raises(DanubeError, match="too long for 11 partitions"):
        partition_names(base, 11)
