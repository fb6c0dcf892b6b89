"""ShardFile reads a sok.dump shard's arrays a range of rows at a time, straight from the file, as
np.load would read them whole; a damaged file is an error naming it."""
import os

import numpy as np
import pytest

from sparse_operation_kit.checkpoint.shard_file import ShardFile


def _arrays():
    rng = np.random.default_rng(3)
    return {
        "keys": rng.integers(-(1 << 40), 1 << 40, 23),
        "values": rng.standard_normal((23, 5)).astype(np.float32),
        "slots": rng.standard_normal((23, 2, 5)).astype(np.float32),
        "freqs": rng.integers(0, 9, 23),
        "dim": np.int64(5),
        "slot_kind": np.int32(2),
        "slot_init": np.zeros([0], np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((4, 3))),
    }


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "compressed"])
def test_rows_and_whole_fields_equal_np_load(tmp_path, save):
    arrays = _arrays()
    path = str(tmp_path / "rank0-of-1.npz")
    save(path, **arrays)
    shard = ShardFile(path, "t")
    assert shard.fields() == set(arrays)
    for field, want in arrays.items():
        got = shard.read(field)
        assert got.dtype == want.dtype and got.shape == want.shape, field
        np.testing.assert_array_equal(got, want, err_msg=field)
        assert shard.shape(field) == want.shape
    for a, b in [(0, 23), (4, 9), (22, 23), (7, 7)]:
        np.testing.assert_array_equal(shard.rows("values", a, b), arrays["values"][a:b])
        np.testing.assert_array_equal(shard.rows("slots", a, b), arrays["slots"][a:b])
        np.testing.assert_array_equal(shard.rows("keys", a, b), arrays["keys"][a:b])


def _saved(tmp_path):
    path = str(tmp_path / "rank0-of-1.npz")
    np.savez(path, **_arrays())
    return path


def test_a_truncated_file_is_an_error_naming_it(tmp_path):
    data = open(_saved(tmp_path), "rb").read()
    for size in (0, 100, len(data) // 2, len(data) - 10):
        cut = str(tmp_path / f"cut{size}.npz")
        with open(cut, "wb") as f:
            f.write(data[:size])
        with pytest.raises(ValueError, match=r"cannot read the shard .*cut.* of 't'.*truncated"):
            ShardFile(cut, "t")


def test_a_file_cut_after_opening_is_an_error_naming_it(tmp_path):
    path = _saved(tmp_path)
    shard = ShardFile(path, "t")
    os.truncate(path, 200)  # replaced under a running load
    with pytest.raises(ValueError, match="truncated or corrupt"):
        shard.rows("values", 0, 23)


def test_a_changed_byte_is_an_error_naming_the_file(tmp_path):
    """zipfile's CRC-32 check runs when the shard opens: a load fails before it changes a table."""
    path = str(tmp_path / "rank0-of-1.npz")
    arrays = _arrays()
    np.savez(path, **arrays)
    data = bytearray(open(path, "rb").read())
    at = bytes(data).find(arrays["values"].tobytes()[:16])
    assert at > 0
    data[at + 5] ^= 0x40
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"cannot read the shard .* of 't'.*CRC"):
        ShardFile(path, "t")


def test_rows_beyond_a_field_are_an_error(tmp_path):
    shard = ShardFile(_saved(tmp_path), "t")
    with pytest.raises(ValueError, match=r"rows \[20, 24\) of 'values' .* shape \(23, 5\)"):
        shard.rows("values", 20, 24)


def test_big_endian_fields_read_as_native(tmp_path):
    path = str(tmp_path / "rank0-of-1.npz")
    values = np.arange(12, dtype=">f4").reshape(4, 3)
    np.savez(path, values=values)
    got = ShardFile(path, "t").rows("values", 1, 3)
    assert got.dtype.isnative
    np.testing.assert_array_equal(got, values[1:3])
