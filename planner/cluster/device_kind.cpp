#include "planner/cluster/device_kind.h"

#include "planner/support/words.h"

namespace rannc::cluster {
namespace {
const char *const kWords[] = {"cpu", "cuda"}; // DeviceKind order
} // namespace

const char *deviceKindName(DeviceKind k) { return kWords[int(k)]; }

std::vector<std::string> deviceKindNames() { return wordList(kWords); }

Expected<DeviceKind> parseDeviceKind(std::string_view text) {
  if (auto k = enumFromWord<DeviceKind>(text, kWords)) return *k;
  return Error{"must be cpu or cuda (got '" + std::string(text) + "')"};
}

} // namespace rannc::cluster
