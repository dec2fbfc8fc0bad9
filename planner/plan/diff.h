// What changed between two plans (rannc-plan diff), for people reviewing a
// hand edit or a re-plan.
#pragma once

#include <ostream>

#include "plan.pb.h"

namespace rannc::plan {

/// Prints one line per difference, decisions first (batch, micro-batches,
/// schedule, stage op ranges and ranks), then estimates with their % change,
/// then the model, cluster and graph; "plans are identical" when the
/// messages are equal. Returns true when they are.
bool printPlanDiff(const proto::Plan &a, const proto::Plan &b, std::ostream &os);

} // namespace rannc::plan
