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
#include <unordered_map>
#include <vector>

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
  bool contains(int64_t key) const { return index_.count(key) != 0; }
  int64_t file_bytes() const { return end_; }
  int64_t garbage_bytes() const { return garbage_; }

  // The record of a present key.
  Status read(int64_t key, Record* out) const;
  // Writes the records (one write); a key already present is replaced.
  Status append(const std::vector<Record>& records);
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
  // Maps [0, end_) of the file; writers call it when the file changed. Best effort: reads
  // outside the mapping use pread.
  void remap();
  void unmap();

  std::string table_;
  std::string dir_;
  std::string file_;
  int fd_ = -1;
  const char* map_ = nullptr;
  int64_t mapped_ = 0;   // bytes of the file in map_
  int64_t end_ = 0;      // file length
  int64_t garbage_ = 0;  // bytes of replaced and removed records
  std::unordered_map<int64_t, Loc> index_;
};

}  // namespace sok
