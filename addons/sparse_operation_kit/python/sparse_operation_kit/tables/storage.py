"""Multi-tier storage of an Embedding Variable: DeepRec's `StorageOption`, `StorageType` and
`CacheStrategy`.

A table of a multi-tier type keeps every row in its lowest tier and caches the most used rows in
the tiers above, each within its byte budget `storage_size[i]` (LFU: the most frequently looked-up
rows; LRU: the most recently looked-up or updated rows). Lookups and updates give the same results
as a table kept whole in DRAM, whatever tier a row is in.

Supported here: DRAM (one tier, the default: host memory on the CPU, GPU memory for a table
placed on a GPU); DRAM_SSDHASH (a DRAM cache over a file-backed hash store under
`storage_path`), on the CPU; HBM (every row in GPU memory), HBM_DRAM (a GPU-memory cache over
rows in pinned host memory) and HBM_DRAM_SSDHASH (HBM_DRAM whose host tier caches the rows of a
file-backed hash store under `storage_path`: `storage_size=[hbm_bytes, dram_bytes]`), on the GPU.
PMEM and LevelDB tiers are not built. A type is refused where it is not built (HBM, HBM_DRAM and
HBM_DRAM_SSDHASH on the CPU, DRAM_SSDHASH on the GPU: the error names the table when its
initializer runs), never placed elsewhere. HBM_DRAM_SSDHASH's tests (tests/gpu/test_tiered_table,
and tests/python/tables under SOK_TEST_DEVICE=gpu) pass on the GPU; its speed, and every tier's:
benchmarks/embedding/README.md (Tiered tables).

What a row costs in a byte budget (ROW_META_BYTES):
    4 * dim * (1 + slots) bytes of values and optimizer slots (slots: 0 before the first update,
    1 for Adagrad, 2 for Adam and FTRL), plus 32 bytes of metadata: the key (8), its frequency
    (4) and version (4), its index slot (8) and its recency stamp (8). Not counted: the hash maps'
    own overhead (the SSD tier's key -> offset index, the stamps' map) and the table's spare index
    room. The budget holds between operations. DRAM_SSDHASH: an operation's keys are in DRAM
    while it runs, and afterwards the coldest rows move down in a batch (to 15/16 of the budget).
    HBM_DRAM: an operation reads and updates each row in whichever tier holds it; after an update
    a bounded pass moves the hottest host rows into free GPU room or swaps them for colder ones.
    HBM_DRAM_SSDHASH: as HBM_DRAM, and while the file holds rows an operation's keys go to the
    host once: their rows on file move into host memory before an update or insertion (an
    evaluation read reads them from the file and moves nothing); afterwards, when host memory is
    over its budget, its coldest rows (LFU: fewest lookups; LRU: oldest update) go to the file in
    a batch (to 15/16 of the budget).
"""
import enum
import numbers
import os

import numpy as np

# The per-row metadata counted in a tier's budget (core/tier_policy.h's kTierRowMetaBytes).
ROW_META_BYTES = 32


class StorageType(enum.IntEnum):
    """DeepRec's storage types (config_pb2.StorageType), with DeepRec's numeric values."""

    DEFAULT = 0
    DRAM = 1
    PMEM_MEMKIND = 2
    PMEM_LIBPMEM = 3
    SSDHASH = 4
    LEVELDB = 5
    HBM = 6
    DRAM_PMEM = 11
    DRAM_SSDHASH = 12
    HBM_DRAM = 13
    DRAM_LEVELDB = 14
    DRAM_PMEM_SSDHASH = 101
    HBM_DRAM_SSDHASH = 102


class CacheStrategy(enum.IntEnum):
    """Which rows a tier caches (DeepRec's config_pb2.CacheStrategy values)."""

    LRU = 0
    LFU = 1


# The tiers of each type, top to bottom.
_TIERS = {
    StorageType.DEFAULT: ("DRAM",),
    StorageType.DRAM: ("DRAM",),
    StorageType.PMEM_MEMKIND: ("PMEM",),
    StorageType.PMEM_LIBPMEM: ("PMEM",),
    StorageType.SSDHASH: ("SSDHASH",),
    StorageType.LEVELDB: ("LEVELDB",),
    StorageType.HBM: ("HBM",),
    StorageType.DRAM_PMEM: ("DRAM", "PMEM"),
    StorageType.DRAM_SSDHASH: ("DRAM", "SSDHASH"),
    StorageType.HBM_DRAM: ("HBM", "DRAM"),
    StorageType.DRAM_LEVELDB: ("DRAM", "LEVELDB"),
    StorageType.DRAM_PMEM_SSDHASH: ("DRAM", "PMEM", "SSDHASH"),
    StorageType.HBM_DRAM_SSDHASH: ("HBM", "DRAM", "SSDHASH"),
}
SUPPORTED = (StorageType.DEFAULT, StorageType.DRAM, StorageType.DRAM_SSDHASH, StorageType.HBM,
             StorageType.HBM_DRAM, StorageType.HBM_DRAM_SSDHASH)
# The types with a cache tier over a lower one.
TIERED = (StorageType.DRAM_SSDHASH, StorageType.HBM_DRAM, StorageType.HBM_DRAM_SSDHASH)


def tiers_of(storage_type):
    """The tiers of a StorageType, top to bottom (e.g. ("HBM", "DRAM"))."""
    return _TIERS[StorageType(storage_type)]


def _enum_member(value, cls, what):
    """A member of `cls` from a member, its name or its DeepRec number; None if unknown."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        return cls.__members__.get(value)
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        try:
            return cls(int(value))
        except ValueError:
            return None
    return None


class StorageOption:
    """Where the rows of an Embedding Variable live (DeepRec's `tf.StorageOption`).

    storage_type: a `sok.StorageType` (or its name, or DeepRec's number).
    storage_path: an existing writable directory, for types with an SSD tier: each table keeps its
        files in a directory of its own below it, removed when the table is destroyed.
    storage_size: the byte budget of each cached tier (every tier but the lowest), top first:
        DRAM_SSDHASH takes one entry, the DRAM bytes; HBM_DRAM one, the GPU-memory bytes;
        HBM_DRAM_SSDHASH two, the GPU-memory bytes then the DRAM bytes. See this module's
        docstring for a row's cost.
    cache_strategy: `sok.CacheStrategy.LFU` (default) or `LRU`.

    The option is checked when a table is made with it, so that each error names the table.
    """

    def __init__(self, storage_type, storage_path=None, storage_size=None,
                 cache_strategy=CacheStrategy.LFU):
        self.storage_type = storage_type
        self.storage_path = storage_path
        self.storage_size = storage_size
        self.cache_strategy = cache_strategy


class StoragePlan:
    """A checked StorageOption: what the table's initializer op takes."""

    def __init__(self, storage_type=StorageType.DRAM, path="", sizes=(),
                 strategy=CacheStrategy.LFU):
        self.storage_type = StorageType(storage_type)
        self.path = path
        self.sizes = [int(s) for s in sizes]
        self.strategy = CacheStrategy(strategy)

    @property
    def tiered(self):
        return self.storage_type in TIERED

    def to_config(self):
        """A JSON-able description (Keras layer configs); None for plain DRAM."""
        if not self.tiered:
            return None
        return {"storage_type": self.storage_type.name, "storage_path": self.path,
                "storage_size": list(self.sizes), "cache_strategy": self.strategy.name}


def option_from_config(config):
    """The StorageOption of StoragePlan.to_config()'s description (None: plain DRAM)."""
    if config is None:
        return None
    return StorageOption(config["storage_type"], config["storage_path"], config["storage_size"],
                         config["cache_strategy"])


def _sizes(option, tiers, where):
    cached = len(tiers) - 1
    sizes = option.storage_size
    if sizes is None:
        if cached:
            raise ValueError(f"{where}: storage_size is missing; {option.storage_type.name} needs "
                             f"the byte budget of its {cached} cached tier(s) {list(tiers[:-1])}")
        return []
    if isinstance(sizes, (numbers.Real, np.integer)):
        sizes = [sizes]
    sizes = list(sizes)
    if len(sizes) != cached:
        raise ValueError(f"{where}: storage_size has {len(sizes)} entries, but "
                         f"{option.storage_type.name} has {cached} cached tier(s) "
                         f"{list(tiers[:-1])}: one byte budget per cached tier")
    out = []
    for tier, s in zip(tiers, sizes, strict=False):
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (numbers.Integral, np.integer)):
            raise TypeError(f"{where}: storage_size of tier {tier} must be an integer number of "
                            f"bytes, got {s!r}")
        if s < 0:
            raise ValueError(f"{where}: storage_size of tier {tier} must be >= 0, got {s}")
        out.append(int(s))
    return out


def _path(option, tiers, where):
    path = option.storage_path
    if "SSDHASH" not in tiers:
        if path:
            raise ValueError(f"{where}: storage_path {path!r} is given but "
                             f"{option.storage_type.name} has no SSD tier")
        return ""
    if not path:
        raise ValueError(f"{where}: {option.storage_type.name} needs storage_path, an existing "
                         "writable directory for its SSD tier")
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"{where}: storage_path {path!r} is not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: storage_path {path!r} is not writable")
    return os.path.abspath(path)


def resolve(option, table, dim):
    """The StoragePlan of `option` for table `table` of dimension `dim`; a clear error naming the
    table for anything this build cannot honour."""
    where = f"Embedding Variable '{table}'"
    if option is None:
        return StoragePlan()
    if not isinstance(option, StorageOption):
        raise TypeError(f"{where}: storage_option must be sok.StorageOption, got "
                        f"{type(option).__name__}")
    stype = _enum_member(option.storage_type, StorageType, "storage_type")
    if stype is None:
        raise ValueError(f"{where}: unknown storage_type {option.storage_type!r} (expected one "
                         f"of {', '.join(StorageType.__members__)})")
    strategy = _enum_member(option.cache_strategy, CacheStrategy, "cache_strategy")
    if strategy is None:
        raise ValueError(f"{where}: unknown cache_strategy {option.cache_strategy!r} (expected "
                         "sok.CacheStrategy.LFU or LRU)")
    tiers = _TIERS[stype]
    if stype not in SUPPORTED:
        raise ValueError(f"{where}: storage_type {stype.name} is not supported: this build has "
                         "no PMEM or LevelDB tier, and an SSD tier only under a DRAM cache "
                         "(supported: DRAM, DRAM_SSDHASH on the CPU, DRAM, HBM, HBM_DRAM, "
                         "HBM_DRAM_SSDHASH on the GPU)")
    checked = StorageOption(stype, option.storage_path, option.storage_size, strategy)
    sizes = _sizes(checked, tiers, where)
    row = 4 * dim + ROW_META_BYTES
    for i, size in enumerate(sizes):
        if size < row:
            raise ValueError(f"{where}: the {tiers[i]} budget storage_size[{i}] = {size} bytes "
                             f"is smaller than one row ({row} bytes: 4 * dim {dim} + "
                             f"{ROW_META_BYTES} of metadata, before optimizer slots)")
    path = _path(checked, tiers, where)
    if stype == StorageType.DEFAULT:
        stype = StorageType.DRAM
    return StoragePlan(stype, path, sizes, strategy)
