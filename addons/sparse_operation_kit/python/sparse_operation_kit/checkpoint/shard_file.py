"""One rank's shard of a dump (an .npz of np.savez), read a range of rows at a time.

np.load reads a member whole; a table's values and slots can be most of the host's memory, so
sok.load reads them in chunks straight from the file instead. np.savez stores members
uncompressed: a member's array data lies at a fixed offset in the file, after the zip entry's
local header and the .npy header. A compressed member (another writer's np.savez_compressed)
is read whole. Opening a shard reads every member once through zipfile, which checks its CRC-32,
so a damaged file fails before a load changes any table.
"""
import struct
import zipfile

import numpy as np

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... file name length, extra field length
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _check_crc(z, info):
    """Reads a member through zipfile, which raises BadZipFile at its end on a CRC mismatch."""
    with z.open(info) as member:
        while member.read(1 << 24):
            pass


class ShardFile:
    """The fields of one shard file: `read(field)` whole, `rows(field, a, b)` rows [a, b)."""

    def __init__(self, path, name, what="sok.load"):
        self.path, self._name, self._what = path, name, what
        self._fields = {}  # field -> (data offset, dtype, shape); None: read whole
        self._whole = {}
        try:
            with zipfile.ZipFile(path) as z:
                infos = z.infolist()
                with open(path, "rb") as f:
                    for info in infos:
                        field = info.filename[:-4] if info.filename.endswith(".npy") else None
                        if field is None:
                            continue
                        stored = info.compress_type == zipfile.ZIP_STORED
                        layout = self._layout(f, info) if stored else None
                        if layout is None:
                            self._whole[field] = np.load(z.open(info), allow_pickle=False)
                        else:
                            _check_crc(z, info)
                        self._fields[field] = layout
        except Exception as e:  # zipfile.BadZipFile, EOFError, ValueError, OSError, ...
            raise self._corrupt(e) from e

    @staticmethod
    def _layout(f, info):
        """Where a stored member's array data begins, its dtype and shape; None (read whole) for
        a Fortran-ordered array or a header version without a public reader."""
        f.seek(info.header_offset)
        sig, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
        if sig != b"PK\x03\x04":
            raise ValueError(f"no local header for {info.filename}")
        f.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read_header = _HEADER_READERS.get(version)
        if read_header is None:
            return None
        shape, fortran, dtype = read_header(f)
        if fortran or dtype.hasobject:
            return None
        return f.tell(), dtype, shape

    def _corrupt(self, e):
        return ValueError(
            f"{self._what}: cannot read the shard {self.path} of '{self._name}': "
            f"{type(e).__name__}: {e} "
            "(the file is truncated or corrupt)"
        )

    def fields(self):
        return set(self._fields)

    def shape(self, field):
        layout = self._fields[field]
        return self._whole[field].shape if layout is None else layout[2]

    def read(self, field):
        shape = self.shape(field)
        return self.rows(field, 0, shape[0] if shape else None)

    def rows(self, field, a, b):
        """Rows [a, b) of `field` (b None: a 0-d array whole)."""
        layout = self._fields[field]
        if layout is None:
            whole = self._whole[field]
            return whole if b is None else whole[a:b]
        offset, dtype, shape = layout
        if b is not None and not (shape and 0 <= a <= b <= shape[0]):
            raise ValueError(f"{self._what}: rows [{a}, {b}) of '{field}' in the shard "
                             f"{self.path} of '{self._name}', which has shape {shape}")
        out = np.empty((b - a,) + tuple(shape[1:]) if shape else (), dtype)
        row_bytes = out.itemsize * int(np.prod(shape[1:], dtype=np.int64)) if shape else 0
        try:
            with open(self.path, "rb") as f:
                f.seek(offset + a * row_bytes)
                got = f.readinto(memoryview(out.reshape(-1)).cast("B"))
        except OSError as e:
            raise self._corrupt(e) from e
        if got != out.nbytes:
            raise self._corrupt(EOFError(f"{field} ends after {got} of {out.nbytes} bytes"))
        return out if dtype.isnative else out.astype(dtype.newbyteorder("="))
