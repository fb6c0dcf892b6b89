#include "addons/sparse_operation_kit/core/ssd_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace sok {
namespace {

constexpr int64_t kHeaderWords = 4;  // key, freq, version, number of floats
constexpr int64_t kHeaderBytes = kHeaderWords * sizeof(int64_t);

int64_t record_bytes(int64_t floats) {
  return kHeaderBytes + floats * static_cast<int64_t>(sizeof(float));
}

// pwrite/pread in full (they may move fewer bytes than asked).
bool write_all(int fd, const char* p, int64_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, static_cast<size_t>(n), offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= w, offset += w;
  }
  return true;
}

bool read_all(int fd, char* p, int64_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, static_cast<size_t>(n), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= r, offset += r;
  }
  return true;
}

// A record's header {key, freq, version, number of floats}; its floats follow (put_floats).
void put_header(int64_t key, int64_t freq, int64_t version, int64_t floats,
                std::vector<char>* buf) {
  const int64_t header[kHeaderWords] = {key, freq, version, floats};
  const char* h = reinterpret_cast<const char*>(header);
  buf->insert(buf->end(), h, h + kHeaderBytes);
}

void put_floats(const float* p, int64_t n, std::vector<char>* buf) {
  const char* b = reinterpret_cast<const char*>(p);
  buf->insert(buf->end(), b, b + n * static_cast<int64_t>(sizeof(float)));
}

void serialize(const SsdStore::Record& r, std::vector<char>* buf) {
  const int64_t floats = static_cast<int64_t>(r.row.size());
  put_header(r.key, r.freq, r.version, floats, buf);
  put_floats(r.row.data(), floats, buf);
}

// The table's name, reduced to characters safe in a file name.
std::string safe_name(const std::string& table) {
  std::string s;
  for (char c : table) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '_';
  return s.substr(0, 64);
}

}  // namespace

SsdStore::SsdStore(std::string table, std::string dir, int fd)
    : table_(std::move(table)), dir_(std::move(dir)), file_(dir_ + "/rows.log"), fd_(fd) {}

Status SsdStore::Open(const std::string& root, const std::string& table,
                      std::unique_ptr<SsdStore>* out) {
  std::string tmpl = root + "/sok_ev_" + safe_name(table) + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    return Status::Invalid("table '" + table + "': cannot make its SSD directory below '" + root +
                           "': " + std::strerror(errno));
  }
  const std::string dir(buf.data());
  const std::string file = dir + "/rows.log";
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const std::string why = std::strerror(errno);
    ::rmdir(dir.c_str());
    return Status::Invalid("table '" + table + "': cannot create '" + file + "': " + why);
  }
  out->reset(new SsdStore(table, dir, fd));
  return Status::OK();
}

SsdStore::~SsdStore() {
  unmap();
  if (fd_ >= 0) ::close(fd_);
  ::unlink(file_.c_str());
  ::unlink((file_ + ".compact").c_str());
  ::rmdir(dir_.c_str());
}

Status SsdStore::error(const std::string& what) const {
  return Status::Invalid("table '" + table_ + "': SSD tier '" + file_ + "': " + what + ": " +
                         std::strerror(errno));
}

void SsdStore::unmap() {
  if (map_ != nullptr) ::munmap(const_cast<char*>(map_), static_cast<size_t>(mapped_));
  map_ = nullptr;
  mapped_ = 0;
}

void SsdStore::remap() {
  unmap();
  if (end_ == 0) return;
  // Pages past the file's end are never read (records lie below end_); the file grows into
  // them through pwrite, which a shared mapping sees.
  constexpr int64_t kGrain = int64_t{1} << 21;
  const int64_t bytes = std::max(kGrain, (2 * end_ + kGrain - 1) / kGrain * kGrain);
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return;
  map_ = static_cast<const char*>(p);
  mapped_ = bytes;
}

Status SsdStore::read_at(const Loc& loc, Record* out) const {
  int64_t header[kHeaderWords];
  std::vector<char> copy;
  const char* bytes = copy.data();
  if (loc.offset + loc.bytes <= mapped_) {
    bytes = map_ + loc.offset;
  } else {  // outside the mapping (remap failed): read it
    copy.resize(loc.bytes);
    if (!read_all(fd_, copy.data(), loc.bytes, loc.offset)) return error("read failed");
    bytes = copy.data();
  }
  std::memcpy(header, bytes, kHeaderBytes);
  if (record_bytes(header[3]) != loc.bytes) {
    errno = EIO;
    return error("a record's length disagrees with the index");
  }
  out->key = header[0];
  out->freq = header[1];
  out->version = header[2];
  out->row.resize(header[3]);
  std::memcpy(out->row.data(), bytes + kHeaderBytes, header[3] * sizeof(float));
  return Status::OK();
}

Status SsdStore::read(int64_t key, Record* out) const {
  bool found = false;
  Status s = read_if_present(key, out, &found);
  if (s.ok() && !found) {
    errno = ENOENT;
    return error("key " + std::to_string(key) + " is not in the SSD tier");
  }
  return s;
}

Status SsdStore::read_if_present(int64_t key, Record* out, bool* found) const {
  const KeyOffsets::Entry* e = index_.find(key);
  *found = e != nullptr;
  return *found ? read_at(Loc{e->offset(), e->bytes()}, out) : Status::OK();
}

template <typename Header, typename Floats>
Status SsdStore::append_n(int64_t n, const Header& header, const Floats& floats) {
  std::vector<char> buf;
  std::vector<int64_t> ends(n);
  for (int64_t i = 0; i < n; ++i) {
    const std::array<int64_t, 4> h = header(i);
    const size_t at = buf.size();
    put_header(h[0], h[1], h[2], h[3], &buf);
    floats(i, &buf);
    ends[i] = static_cast<int64_t>(buf.size());
    if (!KeyOffsets::fits(end_ + static_cast<int64_t>(at), ends[i] - static_cast<int64_t>(at))) {
      return Status::Invalid("table '" + table_ + "': SSD tier '" + file_ + "': a record of " +
                             std::to_string(ends[i] - at) + " bytes at offset " +
                             std::to_string(end_ + at) +
                             " is past the tier's limits (records up to " +
                             std::to_string(KeyOffsets::kMaxRecordBytes) + " bytes, files up to " +
                             std::to_string(KeyOffsets::kMaxOffset) + " bytes)");
    }
  }
  if (!write_all(fd_, buf.data(), static_cast<int64_t>(buf.size()), end_)) {
    return error("write failed");
  }
  // Index only once the bytes are written: a failed write leaves the store as it was.
  int64_t start = 0;
  for (int64_t i = 0; i < n; ++i) {
    garbage_ += index_.assign(header(i)[0], end_ + start, ends[i] - start);
    start = ends[i];
  }
  end_ += start;
  if (end_ > mapped_) remap();
  return Status::OK();
}

Status SsdStore::append(const std::vector<Record>& records) {
  return append_n(
      static_cast<int64_t>(records.size()),
      [&](int64_t i) {
        const Record& r = records[i];
        return std::array<int64_t, 4>{r.key, r.freq, r.version, static_cast<int64_t>(r.row.size())};
      },
      [&](int64_t i, std::vector<char>* buf) {
        put_floats(records[i].row.data(), static_cast<int64_t>(records[i].row.size()), buf);
      });
}

Status SsdStore::append(const Rows& rows) {
  return append_n(
      rows.n,
      [&](int64_t i) {
        return std::array<int64_t, 4>{rows.keys[i], rows.freqs[i], rows.versions[i],
                                      rows.dim + rows.slot_floats};
      },
      [&](int64_t i, std::vector<char>* buf) {
        put_floats(rows.values + i * rows.dim, rows.dim, buf);
        put_floats(rows.slots + i * rows.slot_floats, rows.slot_floats, buf);
      });
}

bool SsdStore::remove(int64_t key) {
  const int64_t bytes = index_.erase(key);
  garbage_ += bytes;
  return bytes > 0;
}

Status SsdStore::for_each(const std::function<void(const Record&)>& fn) const {
  std::vector<Loc> locs;
  locs.reserve(index_.size());
  index_.for_each([&](const KeyOffsets::Entry& e) { locs.push_back(Loc{e.offset(), e.bytes()}); });
  std::sort(locs.begin(), locs.end(),
            [](const Loc& a, const Loc& b) { return a.offset < b.offset; });
  Record r;
  for (const Loc& loc : locs) {
    Status s = read_at(loc, &r);
    if (!s.ok()) return s;
    fn(r);
  }
  return Status::OK();
}

Status SsdStore::clear() {
  unmap();
  if (::ftruncate(fd_, 0) != 0) return error("truncate failed");
  index_.clear();
  end_ = garbage_ = 0;
  return Status::OK();
}

Status SsdStore::maybe_compact(int64_t min_bytes) {
  if (garbage_ * 2 <= end_ || end_ < min_bytes) return Status::OK();
  return compact();
}

Status SsdStore::compact() {
  // Copy the live records into a new file, then rename it over the old one: a failure on the
  // way leaves the old file and index in use.
  const std::string tmp = file_ + ".compact";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return error("cannot create '" + tmp + "'");
  KeyOffsets index;
  std::vector<char> buf;
  int64_t end = 0;
  Status s = for_each([&](const Record& r) {
    const int64_t at = end + static_cast<int64_t>(buf.size());
    serialize(r, &buf);
    index.assign(r.key, at, record_bytes(static_cast<int64_t>(r.row.size())));
    if (buf.size() >= (size_t{1} << 22) && write_all(fd, buf.data(), buf.size(), end)) {
      end += static_cast<int64_t>(buf.size());
      buf.clear();
    }
  });
  const bool ok = s.ok() && write_all(fd, buf.data(), buf.size(), end) &&
                  ::rename(tmp.c_str(), file_.c_str()) == 0;
  if (!ok) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s.ok() ? error("compaction failed") : s;
  }
  unmap();
  ::close(fd_);
  fd_ = fd;
  index_.swap(index);
  end_ = end + static_cast<int64_t>(buf.size());
  garbage_ = 0;
  remap();
  return Status::OK();
}

}  // namespace sok
