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

}  // namespace kpa
