// SsdStore: the file-backed cold tier of a table (DeepRec's SSDHASH). A log-structured file of
// records [key, freq, version, n, n floats (values and slots)] and an in-memory key -> offset
// index: writing a key again appends a new record, removing it only forgets its offset; the dead
// bytes are garbage, which compact() drops by rewriting the live records.
//
// Each store owns a fresh directory (made with mkdtemp below the root) and removes its file and
// the directory when destroyed, so tables never share or leak files.
//
// Reads go through a read-only mapping of the file (no system call per record; the writers
// remap it as the file grows). Not thread-safe beyond this: read(), contains() and for_each()
// may run together; the writers (append, remove, clear, compact) need the store alone (the
// tiered table's lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "addons/sparse_operation_kit/core/key_offsets.h"
#include "addons/sparse_operation_kit/core/status.h"

namespace sok {

class SsdStore {
 public:
  struct Record {
    int64_t key = 0;
    int64_t freq = 0;
    int64_t version = 0;
    std::vector<float> row;  // values then slots
  };

  // A store in a new directory below `root` (an existing writable directory); `table` names the
  // table in errors and prefixes the directory's name.
  static Status Open(const std::string& root, const std::string& table,
                     std::unique_ptr<SsdStore>* out);
  ~SsdStore();
  SsdStore(const SsdStore&) = delete;
  SsdStore& operator=(const SsdStore&) = delete;

  const std::string& dir() const { return dir_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  bool contains(int64_t key) const { return index_.find(key) != nullptr; }
  int64_t file_bytes() const { return end_; }
  int64_t garbage_bytes() const { return garbage_; }

  // Rows laid out as a table snapshot's columns: row i is values[i * dim, (i + 1) * dim) then
  // slots[i * slot_floats, (i + 1) * slot_floats).
  struct Rows {
    const int64_t* keys = nullptr;
    const int64_t* freqs = nullptr;
    const int64_t* versions = nullptr;
    const float* values = nullptr;
    const float* slots = nullptr;
    int64_t n = 0, dim = 0, slot_floats = 0;
  };

  // The record of a present key.
  Status read(int64_t key, Record* out) const;
  // Like read, with one index lookup: *found says whether the key is here (out untouched if not).
  Status read_if_present(int64_t key, Record* out, bool* found) const;
  // Writes the records (one write); a key already present is replaced.
  Status append(const std::vector<Record>& records);
  Status append(const Rows& rows);  // the same, straight from a snapshot's columns
  // Forgets the key; returns whether it was present.
  bool remove(int64_t key);
  // Every live record, in file order.
  Status for_each(const std::function<void(const Record&)>& fn) const;
  // Empties the store (and its file).
  Status clear();
  // Rewrites the live records when garbage is over half the file and the file is at least
  // min_bytes long.
  Status maybe_compact(int64_t min_bytes);
  Status compact();

 private:
  struct Loc {
    int64_t offset;
    int64_t bytes;
  };
  SsdStore(std::string table, std::string dir, int fd);
  Status error(const std::string& what) const;
  Status read_at(const Loc& loc, Record* out) const;
  // Maps the file with room to grow (twice its length): the writers call it when the file
  // outgrew the mapping or was replaced, so appends rarely remap and the pages already read stay
  // mapped. Best effort: reads outside the mapping use pread.
  void remap();
  // Writes n records (record i: header(i) = {key, freq, version, number of floats}, then
  // floats(i, buf) appending those floats to buf) in one write and indexes them.
  template <typename Header, typename Floats>
  Status append_n(int64_t n, const Header& header, const Floats& floats);
  void unmap();

  std::string table_;
  std::string dir_;
  std::string file_;
  int fd_ = -1;
  const char* map_ = nullptr;
  int64_t mapped_ = 0;   // bytes mapped at map_ (past the file's end: room to grow)
  int64_t end_ = 0;      // file length
  int64_t garbage_ = 0;  // bytes of replaced and removed records
  KeyOffsets index_;
};

}  // namespace sok
