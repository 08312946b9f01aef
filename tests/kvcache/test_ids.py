from __future__ import annotations

from array import array

import numpy as np
import pytest

from xrt.ids import int64_array, int64_bytes, int64_list


@pytest.mark.parametrize("ids", [[], [7], [0, 151_935, -1, 2**63 - 1, -(2**63)], list(range(1024))])
def test_int64_conversions_match_array_and_numpy(ids: list[int]) -> None:
    assert int64_bytes(ids) == array("q", ids).tobytes()
    np.testing.assert_array_equal(int64_array(ids), np.asarray(ids, dtype=np.int64).reshape(-1))
    assert int64_array(ids).dtype == np.int64


def test_out_of_range_ids_are_refused() -> None:
    with pytest.raises(Exception, match="format requires|out of range|argument"):
        int64_bytes([2**63])


def test_int64_list_inverts_int64_bytes() -> None:
    ids = [3, 0, 151_935, -1, 2**40]
    assert int64_list(int64_bytes(ids)) == ids
    assert type(int64_list(int64_bytes(ids))[0]) is int
