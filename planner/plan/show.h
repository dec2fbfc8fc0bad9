// Human and machine summaries of a plan (rannc-plan show).
#pragma once

#include <ostream>

#include "plan.pb.h"

namespace rannc::plan {

/// The per-stage table and totals, for people.
void printPlanTable(const proto::Plan &plan, std::ostream &os);
/// One JSON object with the keys SPEC.md promises scripts.
void printPlanJson(const proto::Plan &plan, std::ostream &os);
/// "GPIPE" -> "gpipe", "ONE_F_ONE_B" -> "1f1b".
const char *scheduleName(proto::Schedule s);

} // namespace rannc::plan
