// A framework-free error value: the TF glue turns it into errors::InvalidArgument and friends.
#pragma once

#include <string>
#include <utility>

namespace sok {

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status Invalid(std::string msg) { return Status(std::move(msg)); }
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string msg) : message_(std::move(msg)) {}
  std::string message_;
};

}  // namespace sok
