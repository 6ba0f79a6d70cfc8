#pragma once
// kpa::Error: the one exception type kpa throws for bad input.

#include <stdexcept>
#include <string>

namespace kpa {

/// Thrown by every public kpa call that is given arguments it cannot honour. The message
/// names the call, the argument and the offending value.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// The kpa::Error for a well-formed request kpa does not implement (e.g. a head size outside the
/// supported set), as opposed to arguments that contradict each other.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

}  // namespace kpa
