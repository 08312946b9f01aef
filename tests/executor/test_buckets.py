import pytest

from xrt.config import ExecutorArgs
from xrt.executor.buckets import Buckets, default_buckets


def test_default_ladder_128() -> None:
    assert default_buckets(128) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128]


def test_default_ladder_ends_at_max_batch_off_step() -> None:
    assert default_buckets(100) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100]
    assert default_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert default_buckets(3) == [1, 2, 3]
    assert default_buckets(1) == [1]


def test_explicit_buckets_sorted_and_deduplicated() -> None:
    b = Buckets.from_args(ExecutorArgs(max_batch=64, buckets=[8, 1, 8, 32]))
    assert b.sizes == (1, 8, 32)
    assert b.largest == 32


def test_bucket_for_pads_up_and_falls_back_above_largest() -> None:
    b = Buckets.from_args(ExecutorArgs(max_batch=128))
    seed_batches = [1, 2, 3, 5, 7, 8, 13, 16, 31, 47, 100]
    assert [b.bucket_for(n) for n in seed_batches] == [1, 2, 4, 8, 8, 8, 16, 16, 32, 48, 112]
    assert b.bucket_for(128) == 128
    assert b.bucket_for(129) is None


def test_every_batch_gets_the_smallest_holding_bucket() -> None:
    b = Buckets.from_args(ExecutorArgs(max_batch=80))
    for n in range(1, 81):
        got = b.bucket_for(n)
        assert got is not None and got >= n
        assert all(s < n for s in b.sizes if s < got)


def test_bucket_for_rejects_empty_batch() -> None:
    with pytest.raises(ValueError, match="batch must be >= 1"):
        Buckets.from_args(ExecutorArgs()).bucket_for(0)
